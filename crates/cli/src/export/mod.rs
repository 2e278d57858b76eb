//! `--export`: the session's maps for an observability stack, while it runs.
//!
//! * [`metrics`]: maps as metric families (counters, gauges, histograms, labels
//!   from keys), one model for every exporter.
//! * [`prometheus`]: `prometheus=ADDR`, a `/metrics` endpoint.
//! * [`otlp`]: `otlp=URL`, OTLP/HTTP pushes every `--export-interval`.
//! * [`spans`]: a record's calls as OTLP spans (`weft record --export otlp=URL`,
//!   `weft dump --otlp URL`).
//!
//! [`Exporter`] is a `weft_trace::Sink` beside the printer: it asks for the maps
//! through [`Sink::wants_maps`] (a scrape is waiting, a push is due) and the
//! session's run loop answers with [`Sink::maps`] after its next drain.

pub mod metrics;
pub mod otlp;
pub mod prometheus;
pub mod spans;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use weft_trace::sink::Context;
use weft_trace::{MapSnapshot, Record, Sink};

/// One `--export KIND=WHERE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Spec {
    Prometheus(SocketAddr),
    Otlp(String),
}

impl Spec {
    /// `prometheus=ADDR` or `otlp=URL`.
    pub fn parse(s: &str) -> Result<Spec> {
        let Some((kind, place)) = s.split_once('=') else {
            bail!("--export {s}: expected KIND=WHERE: prometheus=ADDR (e.g. prometheus=127.0.0.1:9464) or otlp=URL (e.g. otlp=http://127.0.0.1:4318/v1/metrics)");
        };
        match kind {
            "prometheus" => {
                let addr: SocketAddr = place.parse().map_err(|_| {
                    anyhow!("--export prometheus={place}: not an address to listen on (IP:PORT, e.g. 127.0.0.1:9464)")
                })?;
                Ok(Spec::Prometheus(addr))
            }
            "otlp" => Ok(Spec::Otlp(otlp::parse_url(place)?)),
            other => {
                bail!("--export {s}: unknown kind `{other}` (use prometheus=ADDR or otlp=URL)")
            }
        }
    }
}

/// `--export-interval`: seconds (`10`, `0.5`), or with a unit (`500ms`, `10s`).
pub fn parse_interval(s: &str) -> Result<Duration> {
    let bad = || anyhow!("--export-interval {s}: expected a duration such as 10, 10s or 500ms");
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        (s, 1.0)
    };
    let secs: f64 = num.trim().parse().map_err(|_| bad())?;
    let secs = secs * scale;
    if !secs.is_finite() || secs < 0.01 {
        bail!("--export-interval {s}: must be at least 10ms");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The exporters of one session, as a sink.
pub struct Exporter {
    prometheus: Option<(prometheus::Server, Arc<prometheus::Live>)>,
    otlp: Option<otlp::Pusher>,
    interval: Duration,
    next_push: Instant,
}

impl Exporter {
    /// Start the exporters: the Prometheus endpoint listens from now on (said on
    /// standard error), the OTLP thread waits for its first push.
    pub fn start(specs: &[Spec], interval: Duration) -> Result<Exporter> {
        let mut e = Exporter {
            prometheus: None,
            otlp: None,
            interval,
            next_push: Instant::now() + interval,
        };
        for s in specs {
            match s {
                Spec::Prometheus(addr) => {
                    if e.prometheus.is_some() {
                        bail!("--export prometheus= is given twice");
                    }
                    let live = Arc::new(prometheus::Live::default());
                    let server = prometheus::Server::start(*addr, live.clone())?;
                    eprintln!("weft: serving the maps on http://{}/metrics", server.addr);
                    e.prometheus = Some((server, live));
                }
                Spec::Otlp(url) => {
                    if e.otlp.is_some() {
                        bail!("--export otlp= is given twice");
                    }
                    e.otlp = Some(otlp::Pusher::start(url.clone())?);
                }
            }
        }
        Ok(e)
    }

    fn push_due(&self) -> bool {
        self.otlp.is_some() && Instant::now() >= self.next_push
    }

    fn deliver(&mut self, maps: &[MapSnapshot], cx: &Context<'_>, last: bool) {
        let families = metrics::families(&cx.prog.maps, maps, cx.resolver);
        if let Some((_, live)) = &self.prometheus {
            live.put(families.clone());
        }
        if let Some(p) = &self.otlp {
            if last || self.push_due() {
                p.push(families);
                self.next_push = Instant::now() + self.interval;
            }
        }
    }
}

impl Sink for Exporter {
    fn record(&mut self, _rec: &Record, _cx: &Context<'_>) {}

    fn wants_maps(&self) -> bool {
        self.push_due() || self.prometheus.as_ref().is_some_and(|(_, l)| l.wanted())
    }

    fn maps(&mut self, maps: &[MapSnapshot], cx: &Context<'_>) {
        self.deliver(maps, cx, false);
    }

    fn finish(&mut self, maps: &[MapSnapshot], cx: &Context<'_>) {
        self.deliver(maps, cx, true);
        // The last push goes out before weft exits.
        if let Some(mut p) = self.otlp.take() {
            if let Some(line) = p.close() {
                eprintln!("{line}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert_eq!(
            Spec::parse("prometheus=127.0.0.1:9464").unwrap(),
            Spec::Prometheus("127.0.0.1:9464".parse().unwrap())
        );
        assert!(Spec::parse("prometheus=localhost").is_err());
        assert!(Spec::parse("statsd=1.2.3.4:1").is_err());
        assert!(Spec::parse("prometheus").is_err());
        assert_eq!(
            Spec::parse("otlp=http://127.0.0.1:4318/v1/metrics").unwrap(),
            Spec::Otlp("http://127.0.0.1:4318/v1/metrics".into())
        );
        assert_eq!(parse_interval("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_interval("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_interval("2s").unwrap(), Duration::from_secs(2));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("x").is_err());
    }
}
