//! A record's calls as OpenTelemetry spans, sent over OTLP/HTTP (protobuf) to a
//! collector: `weft record --export otlp=URL` when the recording ends, and
//! `weft dump --otlp URL` for a record made before.
//!
//! Every call is a span named after its function, kind `INTERNAL`, its parent the
//! call that made it; each outermost call of a thread starts a trace of its own
//! (a tree of calls is what one request of a server is, when the outermost
//! recorded function is its handler). Start and end times are the record's
//! monotonic times moved to the Unix clock by the offset between the two clocks
//! that `weft record` noted when it began (`realtime_offset_ns` in the record's
//! metadata; read on this machine now for a record without one). Attributes:
//! `thread.id`, `code.function.name`, `weft.argN` for the recorded arguments,
//! `weft.retval` when the record has return values; a call that had no exit (left
//! by `longjmp`, or still running when the record ends) ends at its thread's last
//! time with `weft.unfinished = true` and an unset status. Each process is a
//! resource (`service.name` the program's file name, `process.pid`).
//!
//! Spans go in requests of [`BATCH`], each POSTed as it fills, so a long record
//! never sits whole in memory. Trace and span ids are a per-export random value
//! mixed with a counter: unique within the export, and across exports of the same
//! record.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Result};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{span, ResourceSpans, ScopeSpans, Span};
use prost::Message;
use weft_trace::calls::{Step, ThreadId};

/// Spans in one request (a few hundred bytes each: well under a collector's
/// default 4 MiB request limit).
pub const BATCH: usize = 4096;

/// The longest one POST may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how the spans of one record go.
pub struct Spans {
    url: String,
    agent: ureq::Agent,
    /// The program's file name: each process's `service.name`.
    service: String,
    /// Unix time less monotonic time, ns.
    offset: i64,
    /// `weft record --retval`: exits carry return values worth sending.
    retval: bool,
    /// Mixed into every id.
    nonce: u64,
    next_id: u64,
    /// Each thread's open calls: (span id, trace id), outermost first.
    open: HashMap<ThreadId, Vec<(u64, u128)>>,
    /// Finished spans not sent yet, by process.
    pending: BTreeMap<u32, Vec<Span>>,
    pending_len: usize,
    /// Spans and requests sent so far.
    pub sent: u64,
    pub requests: u64,
}

/// The offset of the Unix clock from the monotonic one, now (ns).
pub fn realtime_offset_now() -> i64 {
    let read = |clock| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec out pointer; both clocks always exist.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        ts.tv_sec * 1_000_000_000 + ts.tv_nsec
    };
    let mono = read(libc::CLOCK_MONOTONIC);
    let real = read(libc::CLOCK_REALTIME);
    real - mono
}

/// Check an OTLP/HTTP URL for spans: a URL without a path gets `/v1/traces`.
pub fn traces_url(url: &str, flag: &str) -> Result<String> {
    super::otlp::parse_url_with(url, "/v1/traces", flag)
}

impl Spans {
    /// `service`: the recorded program's name; `offset`: see
    /// [`realtime_offset_now`]; `retval`: whether exits carry return values.
    pub fn new(url: String, service: String, offset: i64, retval: bool) -> Spans {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(SEND_TIMEOUT))
            .http_status_as_error(true)
            .build()
            .into();
        // A random nonce (std's randomly keyed hasher) keeps two exports of one
        // record apart.
        let nonce = {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        Spans {
            url,
            agent,
            service,
            offset,
            retval,
            nonce,
            next_id: 0,
            open: HashMap::new(),
            pending: BTreeMap::new(),
            pending_len: 0,
            sent: 0,
            requests: 0,
        }
    }

    /// A fresh non-zero id.
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        // splitmix64 of nonce + counter: a bijection, so ids never repeat.
        let mut z = self
            .nonce
            .wrapping_add(self.next_id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        if z == 0 {
            self.id()
        } else {
            z
        }
    }

    fn unix(&self, t: u64) -> u64 {
        (t as i64).saturating_add(self.offset).max(0) as u64
    }

    /// Take one step of the record's walk; a full batch is sent at once.
    pub fn step(&mut self, s: Step<'_>) -> Result<()> {
        match s {
            Step::Entry { thread, depth, .. } => {
                let span = self.id();
                let trace = match self.open.get(&thread).and_then(|o| o.first()) {
                    Some(&(_, t)) if depth > 0 => t,
                    _ => (u128::from(self.id()) << 64) | u128::from(self.id()),
                };
                let stack = self.open.entry(thread).or_default();
                stack.truncate(depth);
                stack.push((span, trace));
            }
            Step::Exit {
                names,
                thread,
                depth,
                name,
                start,
                end,
                args,
                retval,
                ..
            } => {
                let stack = self.open.entry(thread).or_default();
                let Some(&(span, trace)) = stack.get(depth) else {
                    return Ok(());
                };
                let parent = depth.checked_sub(1).and_then(|d| stack.get(d)).map(|p| p.0);
                stack.truncate(depth);
                let mut attributes = vec![
                    int("thread.id", i64::from(thread.1)),
                    super::otlp::kv("code.function.name", &names[name]),
                ];
                for (i, a) in args.iter().enumerate() {
                    attributes.push(int(&format!("weft.arg{i}"), *a as i64));
                }
                match retval {
                    Some(v) if self.retval => attributes.push(int("weft.retval", v as i64)),
                    Some(_) => {}
                    None => attributes.push(KeyValue {
                        key: "weft.unfinished".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::BoolValue(true)),
                        }),
                        ..Default::default()
                    }),
                }
                let span = Span {
                    trace_id: trace.to_be_bytes().to_vec(),
                    span_id: span.to_be_bytes().to_vec(),
                    parent_span_id: parent.map(|p| p.to_be_bytes().to_vec()).unwrap_or_default(),
                    name: names[name].clone(),
                    kind: span::SpanKind::Internal as i32,
                    start_time_unix_nano: self.unix(start),
                    end_time_unix_nano: self.unix(end),
                    attributes,
                    ..Default::default()
                };
                self.pending.entry(thread.0).or_default().push(span);
                self.pending_len += 1;
                if self.pending_len >= BATCH {
                    self.flush()?;
                }
            }
        }
        Ok(())
    }

    /// Send the spans not sent yet.
    pub fn flush(&mut self) -> Result<()> {
        if self.pending_len == 0 {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let n = self.pending_len;
        self.pending_len = 0;
        let body = request(&self.service, pending).encode_to_vec();
        self.agent
            .post(&self.url)
            .content_type("application/x-protobuf")
            .send(&body[..])
            .map_err(|e| anyhow!("sending spans to {} failed: {e}", self.url))?;
        self.sent += n as u64;
        self.requests += 1;
        Ok(())
    }
}

/// Send every call of the record at `path` (a file, or a directory holding
/// `weft.rec`) to `url` as spans.
pub fn send_record(path: &Path, url: &str) -> Result<Spans> {
    let opened = crate::replay_cmd::open(path)?;
    let note = &opened.metadata()["record"];
    let offset = note["realtime_offset_ns"]
        .as_i64()
        .unwrap_or_else(realtime_offset_now);
    let service = note["program"]
        .as_str()
        .and_then(|p| Path::new(p).file_name())
        .map_or_else(|| "weft".to_string(), |n| n.to_string_lossy().into_owned());
    let mut spans = Spans::new(url.to_string(), service, offset, opened.retval);
    let mut failed = None;
    opened.walk(|s| {
        if failed.is_none() {
            failed = spans.step(s).err();
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    spans.flush()?;
    Ok(spans)
}

fn int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(value)),
        }),
        ..Default::default()
    }
}

/// One request: a resource per process, its spans in one scope.
fn request(service: &str, by_pid: BTreeMap<u32, Vec<Span>>) -> ExportTraceServiceRequest {
    ExportTraceServiceRequest {
        resource_spans: by_pid
            .into_iter()
            .map(|(pid, spans)| ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![
                        super::otlp::kv("service.name", service),
                        int("process.pid", i64::from(pid)),
                    ],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    scope: Some(super::otlp::scope()),
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_never_zero() {
        let mut s = Spans::new(
            "http://127.0.0.1:1/v1/traces".into(),
            "app".into(),
            0,
            false,
        );
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100_000 {
            let id = s.id();
            assert_ne!(id, 0);
            assert!(seen.insert(id));
        }
    }

    #[test]
    fn urls_get_the_traces_path() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318", "--otlp").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://h:1/x", "--otlp").unwrap(),
            "http://h:1/x"
        );
        assert!(traces_url("https://h", "--otlp").is_err());
    }
}
