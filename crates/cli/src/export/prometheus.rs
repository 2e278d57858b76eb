//! `--export prometheus=ADDR`: the session's maps on `GET /metrics`.
//!
//! A thread serves HTTP (`tiny_http`). A scrape asks the session for fresh maps
//! ([`Live::want`]); the session's run loop sees it after its next drain (within
//! 20 ms), reads the maps from the segment and hands them over ([`Live::put`]),
//! and the scrape encodes them with `prometheus-client` (OpenMetrics text, which
//! Prometheus reads: counters get their `_total` suffix, the text ends with
//! `# EOF`). If the run loop does not answer within a second (the session is
//! still weaving, or over), the scrape gets the last maps it had.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::metrics::{Family, Kind, PointValue};

/// How long a scrape waits for the run loop's fresh maps.
const FRESH_WAIT: Duration = Duration::from_secs(1);

/// The maps between the session and the HTTP thread.
#[derive(Default)]
pub struct Live {
    /// A scrape waits for fresh maps.
    want: AtomicBool,
    state: Mutex<(u64, Vec<Family>)>,
    fresh: Condvar,
}

impl Live {
    /// Whether a scrape waits for the maps.
    pub fn wanted(&self) -> bool {
        self.want.load(Ordering::Acquire)
    }

    /// The maps as they are now.
    pub fn put(&self, families: Vec<Family>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 += 1;
        s.1 = families;
        self.want.store(false, Ordering::Release);
        self.fresh.notify_all();
    }

    /// Fresh maps (or, after [`FRESH_WAIT`], the last ones).
    fn get(&self) -> Vec<Family> {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let seen = s.0;
        self.want.store(true, Ordering::Release);
        let (s, _) = self
            .fresh
            .wait_timeout_while(s, FRESH_WAIT, |s| s.0 == seen)
            .unwrap_or_else(|e| e.into_inner());
        s.1.clone()
    }
}

/// The HTTP server: serves until dropped.
pub struct Server {
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub addr: SocketAddr,
}

impl Server {
    /// Listen on `addr` and serve `live`'s maps.
    pub fn start(addr: SocketAddr, live: Arc<Live>) -> Result<Server> {
        let server = tiny_http::Server::http(addr)
            .map_err(|e| anyhow!("--export prometheus={addr}: cannot listen there ({e})"))?;
        let addr = server.server_addr().to_ip().unwrap_or(addr);
        let server = Arc::new(server);
        let s = server.clone();
        let thread = std::thread::Builder::new()
            .name("weft-prometheus".into())
            .spawn(move || serve(&s, &live))?;
        Ok(Server {
            server,
            thread: Some(thread),
            addr,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(server: &tiny_http::Server, live: &Live) {
    for req in server.incoming_requests() {
        let path = req.url().split('?').next().unwrap_or("");
        let resp = if *req.method() != tiny_http::Method::Get {
            tiny_http::Response::from_string("only GET /metrics\n").with_status_code(405)
        } else if path == "/metrics" {
            let text = encode(&live.get());
            let ct = tiny_http::Header::from_bytes(
                "Content-Type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
            .expect("a valid header");
            tiny_http::Response::from_string(text).with_header(ct)
        } else {
            tiny_http::Response::from_string("weft serves GET /metrics\n").with_status_code(404)
        };
        let _ = req.respond(resp);
    }
}

/// The families in the OpenMetrics text format.
pub fn encode(families: &[Family]) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Families(families.to_vec())));
    let mut out = String::new();
    // Writing to a String cannot fail; a family prometheus-client refuses is
    // left out of this scrape by the collector.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

#[derive(Debug)]
struct Families(Vec<Family>);

impl Collector for Families {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let ty = match f.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
                Kind::Histogram => MetricType::Histogram,
            };
            let mut family = encoder.encode_descriptor(&f.name, &f.help, None, ty)?;
            for p in &f.points {
                let mut m = family.encode_family(&p.labels)?;
                match &p.value {
                    PointValue::Counter(v) => m.encode_counter::<NoLabelSet, _, u64>(v, None)?,
                    PointValue::Gauge(v) => m.encode_gauge(v)?,
                    PointValue::Histogram(h) => {
                        let buckets: Vec<(f64, u64)> = h
                            .counts
                            .iter()
                            .enumerate()
                            .map(|(i, &c)| (h.bounds.get(i).copied().unwrap_or(f64::INFINITY), c))
                            .collect();
                        m.encode_histogram::<NoLabelSet>(
                            h.sum_lower_bound,
                            h.count,
                            &buckets,
                            None,
                        )?
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::metrics::{Histogram, Point};
    use super::*;

    #[test]
    fn text() {
        let fams = vec![
            Family {
                name: "weft_calls".into(),
                help: "weft map @calls (count())".into(),
                kind: Kind::Counter,
                points: vec![Point {
                    labels: vec![("key".into(), "a\"b\\c".into())],
                    value: PointValue::Counter(7),
                }],
            },
            Family {
                name: "weft_lat".into(),
                help: "weft map @lat (hist())".into(),
                kind: Kind::Histogram,
                points: vec![Point {
                    labels: vec![],
                    value: PointValue::Histogram(Histogram {
                        bounds: vec![-1.0, 0.0, 1.0],
                        counts: vec![0, 2, 3, 0],
                        count: 5,
                        sum_lower_bound: 3.0,
                    }),
                }],
            },
        ];
        let t = encode(&fams);
        assert!(t.contains("# TYPE weft_calls counter\n"), "{t}");
        assert!(
            t.contains("weft_calls_total{key=\"a\\\"b\\\\c\"} 7\n"),
            "{t}"
        );
        assert!(t.contains("weft_lat_bucket{le=\"0.0\"} 2\n"), "{t}");
        assert!(t.contains("weft_lat_bucket{le=\"1.0\"} 5\n"), "{t}");
        assert!(t.contains("weft_lat_bucket{le=\"+Inf\"} 5\n"), "{t}");
        assert!(t.contains("weft_lat_count 5\n"), "{t}");
        assert!(t.ends_with("# EOF\n"), "{t}");
    }
}
