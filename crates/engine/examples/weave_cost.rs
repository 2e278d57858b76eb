//! What weaving and unweaving cost while a session runs (`bench/run dynamic`).
//!
//! usage: weave_cost BINARY CYCLES
//!
//! Starts BINARY (a `bench/targets/gen_funcs.py` program: it prints `ready`, then
//! calls all its `fn_*` functions forever), attaches to it with nothing woven, then
//! weaves `uprobe:BINARY:fn_* { @c = count(); }` while it runs and, CYCLES times,
//! unweaves and reweaves those sites. Prints one JSON object: the number of sites,
//! and for each operation the wall time weft took and the time the target was
//! stopped (milliseconds).

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Instant;

use weft_engine::{Options, Session};
use weft_trace::{Context, MapSnapshot, Record, Sink};

struct Quiet;

impl Sink for Quiet {
    fn record(&mut self, _: &Record, _: &Context<'_>) {}
    fn finish(&mut self, _: &[MapSnapshot], _: &Context<'_>) {}
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (bin, cycles) = match &args[..] {
        [_, bin, cycles] => (bin.clone(), cycles.parse::<usize>()?),
        _ => anyhow::bail!("usage: weave_cost BINARY CYCLES"),
    };
    let mut child = Command::new(&bin).stdout(Stdio::piped()).spawn()?;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line)?;
    anyhow::ensure!(line.trim() == "ready", "{bin} did not start");
    let text = format!("uprobe:{bin}:fn_* {{ @c = count(); }}");
    let compiled = weft_lang::compile(&text, "-e", &weft_lang::Options::default());
    let prog = compiled
        .program
        .ok_or_else(|| anyhow::anyhow!("{:?}", compiled.diagnostics))?;
    let mut s = Session::new(&prog, Options::default(), true)?;
    s.attach(child.id() as i32)?;
    s.prepare_probes(&[])?;
    s.go()?;

    let t = Instant::now();
    let mut w = s.weave(&[0])?;
    let weave_wall = ms(t.elapsed());
    let weave_pause = ms(w.pause);
    let (mut unweave, mut reweave, mut reweave_pause) = (Vec::new(), Vec::new(), Vec::new());
    let mut stops = 0;
    for _ in 0..cycles {
        let t = Instant::now();
        s.unweave(&mut w)?;
        unweave.push(ms(t.elapsed()));
        let t = Instant::now();
        stops += s.reweave(&mut w)?;
        reweave.push(ms(t.elapsed()));
        reweave_pause.push(ms(w.pause));
    }
    let hits = s
        .snapshot(0)
        .entries
        .first()
        .map_or(0, |(_, v)| u64::from_le_bytes(v[..8].try_into().unwrap()));
    s.finish(&mut Quiet)?;
    let _ = child.kill();
    let _ = child.wait();
    let list = |v: &[f64]| {
        let items: Vec<String> = v.iter().map(|x| format!("{x:.4}")).collect();
        format!("[{}]", items.join(","))
    };
    println!(
        "{{\"sites\": {}, \"weave_ms\": {weave_wall:.4}, \"weave_pause_ms\": {weave_pause:.4}, \
         \"unweave_ms\": {}, \"reweave_ms\": {}, \"reweave_pause_ms\": {}, \"reweave_stops\": {stops}, \
         \"hits\": {hits}}}",
        w.site_count(),
        list(&unweave),
        list(&reweave),
        list(&reweave_pause)
    );
    Ok(())
}
