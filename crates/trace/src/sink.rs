//! Where records go.

use weft_ir::Program;
use weft_output::Resolver;

use crate::event::{MapSnapshot, Record};

/// What a sink needs to read records: the program (formats, maps, probe names) and a
/// resolver for addresses in the targets.
pub struct Context<'a> {
    pub prog: &'a Program,
    pub resolver: &'a dyn Resolver,
}

/// An output of a session. Records arrive in time order across every thread and
/// process of the session.
pub trait Sink {
    /// One record.
    fn record(&mut self, rec: &Record, cx: &Context<'_>);
    /// The session is over: every map of the program (in the program's order) as
    /// it ends. bpftrace prints them here.
    fn finish(&mut self, maps: &[MapSnapshot], cx: &Context<'_>);
    /// A batch of records was delivered (an output may flush).
    fn flush(&mut self) {}
    /// The probes are about to be attached: `probes` of them (bpftrace announces
    /// it).
    fn attached(&mut self, _probes: usize) {}
    /// Of the probes' sites, `sites` are call sites (`call:` probes), each a call
    /// rewritten to reach its stub.
    fn call_sites(&mut self, _sites: usize) {}
    /// Whether the sink wants the maps as they are now (an exporter whose scrape
    /// or push is due). The session asks from its run loop, after each drain, and
    /// answers with [`Sink::maps`]; the default never wants them.
    fn wants_maps(&self) -> bool {
        false
    }
    /// Every map of the program (in the program's order) while the session runs,
    /// because [`Sink::wants_maps`] said so. Not called at the end: that is
    /// [`Sink::finish`].
    fn maps(&mut self, _maps: &[MapSnapshot], _cx: &Context<'_>) {}
}

/// Many sinks as one (text on stdout and a recording, say).
pub struct Tee<'s>(pub Vec<&'s mut dyn Sink>);

impl Sink for Tee<'_> {
    fn record(&mut self, rec: &Record, cx: &Context<'_>) {
        for s in &mut self.0 {
            s.record(rec, cx);
        }
    }
    fn finish(&mut self, maps: &[MapSnapshot], cx: &Context<'_>) {
        for s in &mut self.0 {
            s.finish(maps, cx);
        }
    }
    fn flush(&mut self) {
        for s in &mut self.0 {
            s.flush();
        }
    }
    fn attached(&mut self, probes: usize) {
        for s in &mut self.0 {
            s.attached(probes);
        }
    }
    fn call_sites(&mut self, sites: usize) {
        for s in &mut self.0 {
            s.call_sites(sites);
        }
    }
    fn wants_maps(&self) -> bool {
        self.0.iter().any(|s| s.wants_maps())
    }
    fn maps(&mut self, maps: &[MapSnapshot], cx: &Context<'_>) {
        for s in &mut self.0 {
            if s.wants_maps() {
                s.maps(maps, cx);
            }
        }
    }
}
