//! `--export`: the maps served on a Prometheus `/metrics` endpoint and pushed as
//! OTLP/HTTP metrics while the session runs, with exact values; bad `--export`
//! values are one-line errors, an unreachable OTLP receiver only a warning.
//!
//! The target (tests/targets/export.c) is attached to while it waits for a line
//! on stdin, makes its known calls when told, says `called` and waits again: the
//! test reads the metrics while it waits, then lets it end.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use std::collections::{BTreeMap, BTreeSet};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use prost::Message;

const T: Duration = Duration::from_secs(120);
const UP: &str = "interval:ms:10 /@up == 0/ { @up = 1; printf(\"up\\n\"); }";

fn program(bin: &Path) -> String {
    let b = bin.display();
    format!(
        "uprobe:{b}:handle {{ @calls = count(); @lat = hist(arg0); @by[arg0 % 3] = count(); \
         @total = sum(arg0); }} \
         uprobe:{b}:tag {{ @tags[str(arg0)] = count(); @pair[str(arg0), 7] = count(); }} {UP}"
    )
}

/// The target, waiting.
struct Waiting(Spawned);

impl Waiting {
    fn start(bin: &Path) -> Waiting {
        let w = Waiting(Spawned::start_piped(bin, &[]));
        w.0.wait_line("ready", T);
        w
    }

    fn go(&mut self) {
        let stdin = self.0.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
    }
}

/// `GET path` on `addr`: status line and body.
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// The address weft said it serves on.
fn served_addr(stderr: &str) -> String {
    let l = stderr
        .lines()
        .find(|l| l.contains("serving the maps on http://"))
        .unwrap_or_else(|| panic!("no serving line:\n{stderr}"));
    l.split("http://")
        .nth(1)
        .unwrap()
        .trim_end_matches("/metrics")
        .to_string()
}

#[test]
fn prometheus_serves_the_maps_while_the_session_runs() {
    let bin = build("export.c", Variant::O2_PIE, &[]);
    let mut t = Waiting::start(&bin);
    let prog = program(&bin);
    let pid = t.0.pid().to_string();
    let mut w = Background::start(&[
        "-e",
        &prog,
        "-p",
        &pid,
        "--export",
        "prometheus=127.0.0.1:0",
    ]);
    w.wait_line("serving the maps on http://", true, T);
    w.wait_line("up", false, T);
    let addr = served_addr(&w.stderr_text());
    t.go();
    t.0.wait_line("called", T);
    let (status, body) = http_get(&addr, "/metrics");
    assert!(status.contains("200"), "{status}\n{body}");
    for want in [
        "# TYPE weft_calls counter\n",
        "weft_calls_total 10\n",
        "weft_total_total 55\n",
        "# TYPE weft_by counter\n",
        "weft_by_total{key=\"0\"} 3\n",
        "weft_by_total{key=\"1\"} 4\n",
        "weft_by_total{key=\"2\"} 3\n",
        "weft_tags_total{key=\"plain\"} 2\n",
        // Label values escaped: q"uote\ .
        "weft_tags_total{key=\"q\\\"uote\\\\\"} 1\n",
        "weft_pair_total{key0=\"plain\",key1=\"7\"} 2\n",
        // hist(1..=10): [1] 1, [2, 4) 2, [4, 8) 4, [8, 16) 3; cumulative.
        "# TYPE weft_lat histogram\n",
        "weft_lat_count 10\n",
        "weft_lat_bucket{le=\"-1.0\"} 0\n",
        "weft_lat_bucket{le=\"0.0\"} 0\n",
        "weft_lat_bucket{le=\"1.0\"} 1\n",
        "weft_lat_bucket{le=\"3.0\"} 3\n",
        "weft_lat_bucket{le=\"7.0\"} 7\n",
        "weft_lat_bucket{le=\"15.0\"} 10\n",
        "weft_lat_bucket{le=\"+Inf\"} 10\n",
        // Each value at its bucket's lower bound: 1 + 2*2 + 4*4 + 3*8.
        "weft_lat_sum 45.0\n",
        "# EOF\n",
    ] {
        assert!(body.contains(want), "no {want:?} in:\n{body}");
    }
    let (status, _) = http_get(&addr, "/nothing");
    assert!(status.contains("404"), "{status}");
    t.go();
    let o = w.finish(T);
    let out = ok(&o);
    assert_eq!(map_value(&out, "@calls"), Some(10), "{out}");
}

/// One HTTP request's body, read from `s` (Content-Length framing); `None` at EOF.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line
            .to_ascii_lowercase()
            .strip_prefix("content-length:")
            .map(|v| v.trim().to_string())
        {
            len = v.parse().unwrap();
        }
        head.push_str(&line);
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// A tiny OTLP/HTTP receiver: each request it gets (head, decoded body), answered
/// 200 with an empty export response.
fn receiver<M: Message + Default + Send + 'static>() -> (String, mpsc::Receiver<(String, M)>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(conn) = conn else { break };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut out = conn.try_clone().unwrap();
                let mut r = BufReader::new(conn);
                while let Some((head, body)) = read_request(&mut r) {
                    let req = M::decode(&body[..]).unwrap();
                    let _ = out.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
                    );
                    if tx.send((head, req)).is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, rx)
}

/// Metric `name`'s integer data points as (attributes, value).
fn ints(req: &ExportMetricsServiceRequest, name: &str) -> Vec<(Vec<(String, String)>, i64)> {
    let m = req.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("no metric {name}"));
    let points = match m.data.as_ref().unwrap() {
        metric::Data::Sum(s) => {
            assert!(s.is_monotonic, "{name}");
            assert_eq!(s.aggregation_temporality, 2, "{name}: cumulative");
            &s.data_points
        }
        metric::Data::Gauge(g) => &g.data_points,
        _ => panic!("{name} is not a number"),
    };
    let mut v: Vec<_> = points
        .iter()
        .map(|p| {
            let attrs = p
                .attributes
                .iter()
                .map(|kv| {
                    let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                        Some(
                            opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(
                                s,
                            ),
                        ) => s.clone(),
                        other => panic!("{other:?}"),
                    };
                    (kv.key.clone(), v)
                })
                .collect();
            let Some(number_data_point::Value::AsInt(n)) = p.value else {
                panic!("{name}: not an integer");
            };
            (attrs, n)
        })
        .collect();
    v.sort();
    v
}

/// Every map of `program` as the target leaves it after its calls (a message
/// saying what differs otherwise).
fn check_running(req: &ExportMetricsServiceRequest) -> Result<(), String> {
    let s = |x: &str| x.to_string();
    let check = |name: &str,
                 got: Vec<(Vec<(String, String)>, i64)>,
                 want: Vec<(Vec<(String, String)>, i64)>| {
        if got == want {
            Ok(())
        } else {
            Err(format!("{name}: {got:?}, not {want:?}"))
        }
    };
    check("weft_calls", ints(req, "weft_calls"), vec![(vec![], 10)])?;
    check("weft_total", ints(req, "weft_total"), vec![(vec![], 55)])?;
    check(
        "weft_by",
        ints(req, "weft_by"),
        vec![
            (vec![(s("key"), s("0"))], 3),
            (vec![(s("key"), s("1"))], 4),
            (vec![(s("key"), s("2"))], 3),
        ],
    )?;
    check(
        "weft_tags",
        ints(req, "weft_tags"),
        vec![
            (vec![(s("key"), s("plain"))], 2),
            (vec![(s("key"), s("q\"uote\\"))], 1),
        ],
    )?;
    check(
        "weft_pair",
        ints(req, "weft_pair"),
        vec![
            (vec![(s("key0"), s("plain")), (s("key1"), s("7"))], 2),
            (vec![(s("key0"), s("q\"uote\\")), (s("key1"), s("7"))], 1),
        ],
    )?;
    let lat = req.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .find(|m| m.name == "weft_lat")
        .ok_or("no weft_lat")?;
    let Some(metric::Data::Histogram(h)) = &lat.data else {
        return Err("weft_lat is not a histogram".into());
    };
    assert_eq!(h.aggregation_temporality, 2, "cumulative");
    let p = &h.data_points[0];
    let got = (
        p.count,
        p.explicit_bounds.clone(),
        p.bucket_counts.clone(),
        p.sum,
    );
    // hist(1..=10): [1] 1, [2, 4) 2, [4, 8) 4, [8, 16) 3.
    let want = (
        10,
        vec![-1.0, 0.0, 1.0, 3.0, 7.0, 15.0],
        vec![0, 0, 1, 2, 4, 3, 0],
        None,
    );
    if got != want {
        return Err(format!("weft_lat: {got:?}, not {want:?}"));
    }
    Ok(())
}

#[test]
fn otlp_receiver_gets_the_counters_during_and_at_the_end() {
    let bin = build("export.c", Variant::O2_PIE, &[]);
    let (addr, rx) = receiver::<ExportMetricsServiceRequest>();
    let mut t = Waiting::start(&bin);
    let prog = program(&bin);
    let pid = t.0.pid().to_string();
    let url = format!("otlp=http://{addr}/v1/metrics");
    let mut w = Background::start(&[
        "-e",
        &prog,
        "-p",
        &pid,
        "--export",
        &url,
        "--export-interval",
        "100ms",
    ]);
    w.wait_line("up", false, T);
    t.go();
    t.0.wait_line("called", T);
    // A push of the running session (every 100 ms) taken after every call: one
    // taken during the calls, before `called`, may come first.
    let deadline = Instant::now() + T;
    let mut last = String::new();
    let head = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((head, req)) = rx.recv_timeout(left) else {
            panic!("no OTLP push with every call; the last one: {last}");
        };
        match check_running(&req) {
            Ok(()) => break head,
            Err(e) => last = e,
        }
    };
    assert!(head.starts_with("POST /v1/metrics "), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/x-protobuf"),
        "{head}"
    );
    t.go();
    let o = w.finish(T);
    let out = ok(&o);
    assert_eq!(map_value(&out, "@calls"), Some(10), "{out}");
    // The last push, at the end, has them too.
    let last = std::iter::from_fn(|| rx.recv_timeout(Duration::from_millis(200)).ok())
        .last()
        .expect("no push at the end");
    check_running(&last.1).unwrap();
    assert!(!text(&o.stderr).contains("failed"), "{}", text(&o.stderr));
}

/// No target at all: the maps of BEGIN go out once, at the end.
#[test]
fn otlp_pushes_once_at_the_end() {
    let (addr, rx) = receiver::<ExportMetricsServiceRequest>();
    let url = format!("otlp=http://{addr}");
    let o = weft(
        &[
            "-e",
            "BEGIN { @c = count(); @c = count(); @v = -3; exit(); }",
            "--export",
            &url,
        ],
        T,
    );
    let out = ok(&o);
    assert_eq!(map_value(&out, "@c"), Some(2), "{out}");
    let (head, req) = rx.recv_timeout(T).unwrap();
    assert!(head.starts_with("POST /v1/metrics "), "{head}");
    assert_eq!(calls_named(&req, "weft_c"), 2);
    assert_eq!(ints(&req, "weft_v"), vec![(vec![], -3)]);
}

fn calls_named(req: &ExportMetricsServiceRequest, name: &str) -> i64 {
    ints(req, name)[0].1
}

/// An OTLP receiver that is not there: a warning and a count, the session goes on.
#[test]
fn an_unreachable_otlp_receiver_is_a_warning() {
    // A port nothing listens on (bound, then closed).
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("otlp=http://127.0.0.1:{port}/v1/metrics");
    let o = weft(
        &["-e", "BEGIN { @c = count(); exit(); }", "--export", &url],
        T,
    );
    let out = ok(&o);
    assert_eq!(map_value(&out, "@c"), Some(1), "{out}");
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("weft: --export {url}: sending the maps failed (")),
        "{err}"
    );
    assert!(err.contains("1 of 1 sends failed"), "{err}");
}

#[test]
fn bad_export_values_are_one_line_errors() {
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = format!("prometheus={}", held.local_addr().unwrap());
    for (arg, want) in [
        ("statsd=127.0.0.1:1", "--export statsd=127.0.0.1:1: unknown kind `statsd` (use prometheus=ADDR or otlp=URL)"),
        ("prometheus", "--export prometheus: expected KIND=WHERE"),
        ("prometheus=localhost", "--export prometheus=localhost: not an address to listen on (IP:PORT, e.g. 127.0.0.1:9464)"),
        ("otlp=127.0.0.1:4318", "--export otlp=127.0.0.1:4318: not an http:// URL"),
        ("otlp=https://example.com/v1/metrics", "https is not supported"),
        (taken.as_str(), "cannot listen there"),
    ] {
        let o = weft(&["-e", "BEGIN { exit(); }", "--export", arg], T);
        assert_eq!(o.status.code(), Some(1), "{arg}");
        let err = text(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{arg}: {err}");
        assert!(err.starts_with("weft: "), "{arg}: {err}");
        assert!(err.contains(want), "{arg}: {err}");
    }
    let o = weft(&["-e", "BEGIN { exit(); }", "--export-interval", "soon"], T);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("--export-interval soon: expected a duration"));
}

/// A span as the tests compare it: names, links and times.
#[derive(Clone, Debug)]
struct SpanSeen {
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    start: u64,
    end: u64,
    pid: i64,
    service: String,
    ints: BTreeMap<String, i64>,
}

fn spans_of(reqs: &[(String, ExportTraceServiceRequest)]) -> Vec<SpanSeen> {
    let mut out = Vec::new();
    for (_, req) in reqs {
        for rs in &req.resource_spans {
            let attr = |k: &str| {
                rs.resource
                    .as_ref()
                    .unwrap()
                    .attributes
                    .iter()
                    .find(|a| a.key == k)
                    .and_then(|a| a.value.as_ref()?.value.clone())
            };
            let pid = match attr("process.pid") {
                Some(any_value::Value::IntValue(p)) => p,
                v => panic!("process.pid: {v:?}"),
            };
            let service = match attr("service.name") {
                Some(any_value::Value::StringValue(s)) => s,
                v => panic!("service.name: {v:?}"),
            };
            for ss in &rs.scope_spans {
                for sp in &ss.spans {
                    let mut ints = BTreeMap::new();
                    for a in &sp.attributes {
                        match a.value.as_ref().and_then(|v| v.value.clone()) {
                            Some(any_value::Value::IntValue(i)) => {
                                ints.insert(a.key.clone(), i);
                            }
                            Some(any_value::Value::StringValue(f)) => {
                                assert_eq!(a.key, "code.function.name");
                                assert_eq!(f, sp.name);
                            }
                            v => panic!("{}: {v:?}", a.key),
                        }
                    }
                    assert_eq!(sp.kind, 1, "INTERNAL");
                    out.push(SpanSeen {
                        name: sp.name.clone(),
                        trace: sp.trace_id.clone(),
                        id: sp.span_id.clone(),
                        parent: sp.parent_span_id.clone(),
                        start: sp.start_time_unix_nano,
                        end: sp.end_time_unix_nano,
                        pid,
                        service: service.clone(),
                        ints,
                    });
                }
            }
        }
    }
    out
}

/// replay.c's calls as spans: main(1) → a(1) → b ×3, main → c(5); worker(0) → d
/// ×2 on a second thread: each call's parent is its caller's span, each thread's
/// outermost call a trace of its own, times nested and in the Unix clock.
fn check_replay_spans(spans: &[SpanSeen], before: u64, after: u64) {
    let names: BTreeMap<&str, usize> = spans.iter().fold(BTreeMap::new(), |mut m, s| {
        *m.entry(s.name.as_str()).or_default() += 1;
        m
    });
    let want: BTreeMap<&str, usize> = [
        ("main", 1),
        ("a", 1),
        ("b", 3),
        ("c", 1),
        ("worker", 1),
        ("d", 2),
    ]
    .into();
    assert_eq!(names, want, "{spans:#?}");
    let one = |n: &str| spans.iter().find(|s| s.name == n).unwrap().clone();
    let (main, a, worker) = (one("main"), one("a"), one("worker"));
    let ids: BTreeSet<&Vec<u8>> = spans.iter().map(|s| &s.id).collect();
    assert_eq!(ids.len(), 9, "span ids are unique");
    for s in spans {
        assert_eq!(s.id.len(), 8);
        assert_eq!(s.trace.len(), 16);
        assert!(s.start <= s.end, "{s:?}");
        assert!(
            before <= s.start && s.end <= after,
            "{before} {s:?} {after}"
        );
        assert_eq!(s.pid, main.pid);
        assert_eq!(s.service, "replay");
        let parent = match s.name.as_str() {
            "main" | "worker" => None,
            "a" | "c" => Some(&main),
            "b" => Some(&a),
            "d" => Some(&worker),
            n => panic!("{n}"),
        };
        match parent {
            None => assert!(s.parent.is_empty(), "{s:?}"),
            Some(p) => {
                assert_eq!(s.parent, p.id, "{} in {}", s.name, p.name);
                assert_eq!(s.trace, p.trace, "{} in {}'s trace", s.name, p.name);
                assert!(p.start <= s.start && s.end <= p.end, "{s:?} in {p:?}");
            }
        }
    }
    assert_ne!(
        main.trace, worker.trace,
        "each thread's outermost call starts a trace"
    );
    assert_ne!(main.ints["thread.id"], worker.ints["thread.id"]);
    // The recorded argument and return value of each call.
    let mut b: Vec<(i64, i64)> = spans
        .iter()
        .filter(|s| s.name == "b")
        .map(|s| (s.ints["weft.arg0"], s.ints["weft.retval"]))
        .collect();
    b.sort();
    assert_eq!(b, [(1, 2), (2, 4), (3, 6)]);
    assert_eq!((a.ints["weft.arg0"], a.ints["weft.retval"]), (1, 12));
    let c = one("c");
    assert_eq!((c.ints["weft.arg0"], c.ints["weft.retval"]), (5, 7));
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[test]
fn recorded_calls_reach_an_otlp_receiver_as_spans() {
    let bin = build("replay.c", Variant::O2_PIE, &["-pthread"]);
    let dir = scratch_dir("export-spans").join("rec/");
    let _ = std::fs::remove_dir_all(&dir);
    let (addr, rx) = receiver::<ExportTraceServiceRequest>();
    let mut args = vec!["record"];
    for f in ["main", "a", "b", "c", "d", "worker"] {
        args.extend(["-F", f]);
    }
    let url = format!("otlp=http://{addr}");
    let d = dir.to_str().unwrap();
    args.extend(["--args", "1", "--retval", "-o", d, "--export", &url]);
    args.extend(["--", bin.to_str().unwrap()]);
    let before = unix_ns();
    let o = weft(&args, T);
    let after = unix_ns();
    assert_eq!(ok(&o), "r=19\n");
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!(
            "weft: sent 9 spans to http://{addr}/v1/traces in 1 requests"
        )),
        "{err}"
    );
    let reqs: Vec<_> = rx.try_iter().collect();
    assert_eq!(reqs.len(), 1);
    assert!(reqs[0].0.starts_with("POST /v1/traces "), "{}", reqs[0].0);
    assert!(reqs[0]
        .0
        .to_ascii_lowercase()
        .contains("content-type: application/x-protobuf"));
    let live = spans_of(&reqs);
    check_replay_spans(&live, before, after);

    // The same record sent again later, to a path of the user's choosing: the
    // same calls and times, new ids.
    let o = weft(
        &["dump", "--otlp", &format!("http://{addr}/x/traces"), d],
        T,
    );
    assert_eq!(ok(&o), "");
    let reqs: Vec<_> = rx.try_iter().collect();
    assert_eq!(reqs.len(), 1);
    assert!(reqs[0].0.starts_with("POST /x/traces "), "{}", reqs[0].0);
    let again = spans_of(&reqs);
    check_replay_spans(&again, before, after);
    let times = |v: &[SpanSeen]| -> BTreeSet<(String, u64, u64)> {
        v.iter().map(|s| (s.name.clone(), s.start, s.end)).collect()
    };
    assert_eq!(times(&live), times(&again));
    assert!(live.iter().all(|s| again.iter().all(|t| t.id != s.id)));

    // A collector that is not there: one line, exit 1, the record kept.
    let o = weft(&["dump", "--otlp", "http://127.0.0.1:1", d], T);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("sending spans to http://127.0.0.1:1/v1/traces failed"),
        "{err}"
    );
    // Only spans, only to OTLP.
    let o = weft(
        &[
            "record",
            "--export",
            "prometheus=127.0.0.1:9",
            "--",
            "/bin/true",
        ],
        T,
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("--export otlp=URL"),
        "{}",
        text(&o.stderr)
    );
}
