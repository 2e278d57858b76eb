//! `--export otlp=URL`: the session's maps pushed as OpenTelemetry metrics over
//! OTLP/HTTP (protobuf, `application/x-protobuf`), every `--export-interval` and
//! once at the end.
//!
//! The messages are `opentelemetry-proto`'s prost types (no SDK pipeline: weft's
//! maps are already aggregated, so they are written as data points directly), the
//! POST is `ureq`'s (blocking, no TLS: `http://` only). Counters are cumulative
//! monotonic `Sum`s, gauges `Gauge`s, histograms `Histogram`s with explicit
//! bounds (weft's power-of-two buckets are `[2^i, 2^(i+1))`, OTLP's exponential
//! buckets `(2^i, 2^(i+1)]`: for integers they differ at the powers of two, the
//! explicit bounds are exact). A sending thread does the POSTs, so a slow or
//! unreachable receiver never holds the session; it sends the newest maps it
//! has. A failed send is a warning (the first one said at once), counted, and
//! the session goes on.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Gauge, Histogram, HistogramDataPoint,
    Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::metrics::{Family, Kind, PointValue};

/// The longest one POST may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Check an OTLP/HTTP URL for metrics: `http://HOST[:PORT][/PATH]` (a URL without
/// a path gets the standard `/v1/metrics`).
pub fn parse_url(url: &str) -> Result<String> {
    parse_url_with(url, "/v1/metrics", "--export otlp=")
}

/// Check an OTLP/HTTP URL given as `flag` (for messages); a URL without a path
/// gets `path`.
pub fn parse_url_with(url: &str, path: &str, flag: &str) -> Result<String> {
    let eg = format!("http://127.0.0.1:4318{path}");
    let Some(rest) = url.strip_prefix("http://") else {
        if url.starts_with("https://") {
            bail!("{flag}{url}: https is not supported (weft has no TLS): use an http:// URL, e.g. a local collector's {eg}");
        }
        bail!("{flag}{url}: not an http:// URL (e.g. {eg})");
    };
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        bail!("{flag}{url}: no host in the URL (e.g. {eg})");
    }
    if let Some((_, port)) = host.rsplit_once(':') {
        if !host.ends_with(']') && port.parse::<u16>().is_err() {
            bail!("{flag}{url}: `{port}` is not a port number");
        }
    }
    Ok(if rest.contains('/') {
        url.to_string()
    } else {
        format!("{url}{path}")
    })
}

/// What the session hands the sending thread.
#[derive(Default)]
struct Queue {
    /// The newest maps not sent yet.
    next: Option<Vec<Family>>,
    /// No more maps come: send what is queued and stop.
    closed: bool,
    sent: u64,
    failed: u64,
    last_error: Option<String>,
}

/// The sending thread and its queue.
pub struct Pusher {
    url: String,
    queue: Arc<(Mutex<Queue>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pusher {
    pub fn start(url: String) -> Result<Pusher> {
        let queue: Arc<(Mutex<Queue>, Condvar)> = Arc::default();
        let q = queue.clone();
        let u = url.clone();
        let start = now_ns();
        let thread = std::thread::Builder::new()
            .name("weft-otlp".into())
            .spawn(move || send_loop(&u, &q, start))?;
        Ok(Pusher {
            url,
            queue,
            thread: Some(thread),
        })
    }

    /// Send `families` (replacing maps not sent yet: they are cumulative).
    pub fn push(&self, families: Vec<Family>) {
        let (m, cv) = &*self.queue;
        m.lock().unwrap_or_else(|e| e.into_inner()).next = Some(families);
        cv.notify_all();
    }

    /// Send what is queued, stop the thread; a line about failed sends, if any.
    pub fn close(&mut self) -> Option<String> {
        {
            let (m, cv) = &*self.queue;
            m.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let q = self.queue.0.lock().unwrap_or_else(|e| e.into_inner());
        (q.failed > 0).then(|| {
            format!(
                "weft: --export otlp={}: {} of {} sends failed (last: {})",
                self.url,
                q.failed,
                q.sent + q.failed,
                q.last_error.as_deref().unwrap_or("?")
            )
        })
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        self.close();
    }
}

fn send_loop(url: &str, queue: &(Mutex<Queue>, Condvar), start: u64) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(SEND_TIMEOUT))
        .http_status_as_error(true)
        .build()
        .into();
    let (m, cv) = queue;
    loop {
        let families = {
            let mut q = m.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(f) = q.next.take() {
                    break f;
                }
                if q.closed {
                    return;
                }
                q = cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let body = request(&families, start, now_ns()).encode_to_vec();
        let result = agent
            .post(url)
            .content_type("application/x-protobuf")
            .send(&body[..]);
        let mut q = m.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(_) => q.sent += 1,
            Err(e) => {
                if q.failed == 0 {
                    eprintln!(
                        "weft: --export otlp={url}: sending the maps failed ({e}); the session goes on and sends again at the next interval"
                    );
                }
                q.failed += 1;
                q.last_error = Some(e.to_string());
            }
        }
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A string attribute.
pub(crate) fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
        ..Default::default()
    }
}

/// weft, as the instrumentation scope of what it sends.
pub(crate) fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "weft".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    }
}

/// The export request for `families`: cumulative since `start` (the session's
/// start), at `now` (Unix nanoseconds).
pub fn request(families: &[Family], start: u64, now: u64) -> ExportMetricsServiceRequest {
    let metrics = families
        .iter()
        .map(|f| {
            let attrs = |p: &super::metrics::Point| -> Vec<KeyValue> {
                p.labels.iter().map(|(k, v)| kv(k, v)).collect()
            };
            let numbers = || -> Vec<NumberDataPoint> {
                f.points
                    .iter()
                    .filter_map(|p| {
                        let v = match p.value {
                            PointValue::Counter(c) => c as i64,
                            PointValue::Gauge(g) => g,
                            PointValue::Histogram(_) => return None,
                        };
                        Some(NumberDataPoint {
                            attributes: attrs(p),
                            start_time_unix_nano: start,
                            time_unix_nano: now,
                            value: Some(number_data_point::Value::AsInt(v)),
                            ..Default::default()
                        })
                    })
                    .collect()
            };
            let data = match f.kind {
                Kind::Counter => metric::Data::Sum(Sum {
                    data_points: numbers(),
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                    is_monotonic: true,
                }),
                Kind::Gauge => metric::Data::Gauge(Gauge {
                    data_points: numbers(),
                }),
                Kind::Histogram => metric::Data::Histogram(Histogram {
                    data_points: f
                        .points
                        .iter()
                        .filter_map(|p| {
                            let PointValue::Histogram(h) = &p.value else {
                                return None;
                            };
                            Some(HistogramDataPoint {
                                attributes: attrs(p),
                                start_time_unix_nano: start,
                                time_unix_nano: now,
                                count: h.count,
                                bucket_counts: h.counts.clone(),
                                explicit_bounds: h.bounds.clone(),
                                ..Default::default()
                            })
                        })
                        .collect(),
                    aggregation_temporality: AggregationTemporality::Cumulative as i32,
                }),
            };
            Metric {
                name: f.name.clone(),
                description: f.help.clone(),
                data: Some(data),
                ..Default::default()
            }
        })
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: vec![kv("service.name", "weft")],
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(scope()),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/metrics"
        );
        assert_eq!(parse_url("http://h:1/x").unwrap(), "http://h:1/x");
        assert!(parse_url("https://h/v1/metrics").is_err());
        assert!(parse_url("127.0.0.1:4318").is_err());
        assert!(parse_url("http://h:port/").is_err());
        assert!(parse_url("http:///v1").is_err());
    }
}
