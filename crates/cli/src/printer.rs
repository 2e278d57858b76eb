//! The bpftrace-compatible outputs: records and maps printed as bpftrace prints
//! them (text, or NDJSON with `-f json`), through `weft-output`. A
//! `weft_trace::Sink`.

use std::io::{Read, Write};

use weft_trace::{Context, Event, MapSnapshot, Record, Sink};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Text,
    Json,
}

/// Prints records as bpftrace does.
pub struct Printer<'a> {
    pub out: Box<dyn Write + 'a>,
    pub format: OutputFormat,
    /// `system()` allowed (`--unsafe`).
    pub unsafe_ok: bool,
    /// `out` is a file (`-o FILE`): the blank lines before the final maps go to
    /// standard output instead, as bpftrace writes them, so the file has none.
    pub to_file: bool,
    /// `--no-warnings`: `warnf()` prints nothing.
    pub no_warnings: bool,
}

impl Printer<'_> {
    /// Output of `cat()`, `system()` or `time()`: as it is in text, a
    /// `{"type": KIND, "data": "..."}` record with `-f json` (as bpftrace).
    fn write_message(&mut self, kind: &str, text: &[u8]) {
        let _ = match self.format {
            OutputFormat::Text => self.out.write_all(text),
            OutputFormat::Json => self.out.write_all(&weft_output::json::message(kind, text)),
        };
    }

    fn print_map(&mut self, m: &MapSnapshot, cx: &Context<'_>) {
        let Some(decl) = cx.prog.maps.get(m.map as usize) else {
            return;
        };
        let text = match self.format {
            OutputFormat::Text => {
                weft_output::print_map(decl, &m.entries, m.top, m.div, cx.resolver)
            }
            OutputFormat::Json => {
                weft_output::print_map_json(decl, &m.entries, m.top, m.div, cx.resolver)
            }
        };
        let _ = self.out.write_all(&text);
        let _ = self.out.flush();
    }
}

impl Printer<'_> {
    /// An `errorf`/`warnf` message, as upstream writes it: `LOCATION: ERROR: text`
    /// on standard error (no source line: it would only show the call), or a JSON
    /// record on the output.
    fn message(&mut self, m: &weft_ir::Message, text: &[u8]) {
        let warning = m.level == weft_ir::MessageLevel::Warning;
        if warning && self.no_warnings {
            return;
        }
        match self.format {
            OutputFormat::Text => {
                let _ = self.out.flush();
                let level = if warning { "WARNING" } else { "ERROR" };
                let mut line = format!("{}: {level}: ", m.location()).into_bytes();
                line.extend_from_slice(text);
                line.push(b'\n');
                for c in &m.context {
                    line.extend_from_slice(c.as_bytes());
                    line.push(b'\n');
                }
                let _ = std::io::stderr().write_all(&line);
            }
            OutputFormat::Json => {
                let kind = if warning { "warnf" } else { "errorf" };
                let rec = weft_output::json::located(kind, text, &m.file, m.line, m.col);
                let _ = self.out.write_all(&rec);
            }
        }
    }
}

impl Sink for Printer<'_> {
    fn record(&mut self, r: &Record, cx: &Context<'_>) {
        let fmt = |id: u32| cx.prog.formats.get(id as usize);
        match &r.event {
            Event::Printf { format, args } => {
                if let Some(f) = fmt(*format) {
                    let text = weft_output::format_printf(f, args, cx.resolver);
                    if let Some(m) = &f.message {
                        self.message(m, &text);
                        return;
                    }
                    match self.format {
                        OutputFormat::Text => {
                            let _ = self.out.write_all(&text);
                        }
                        OutputFormat::Json => {
                            let _ = self.out.write_all(&weft_output::json::printf(&text));
                        }
                    }
                }
            }
            Event::Cat { format, args } | Event::System { format, args } => {
                if let Some(f) = fmt(*format) {
                    let arg = weft_output::format_printf(f, args, cx.resolver);
                    let arg = String::from_utf8_lossy(&arg).into_owned();
                    if matches!(r.event, Event::Cat { .. }) {
                        // At most max_cat_bytes, as bpftrace: `cat("/dev/zero")` or a
                        // growing log must not grow weft.
                        let max = u64::from(cx.prog.config.max_cat_bytes);
                        let mut bytes = Vec::new();
                        match std::fs::File::open(&arg)
                            .and_then(|f| f.take(max).read_to_end(&mut bytes))
                        {
                            Ok(_) => self.write_message("cat", &bytes),
                            // Upstream's words (the run goes on).
                            Err(err) => eprintln!(
                                "ERROR: failed to open file '{arg}' ({})",
                                os_message(&err)
                            ),
                        }
                    } else if self.unsafe_ok {
                        let _ = self.out.flush();
                        if let Ok(o) = std::process::Command::new("/bin/sh")
                            .arg("-c")
                            .arg(&arg)
                            .output()
                        {
                            self.write_message("syscall", &o.stdout);
                        }
                    }
                }
            }
            Event::Time { format } => {
                if let Some(f) = fmt(*format) {
                    let secs = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs() as i64);
                    if let Some(text) = weft_output::time::time_text(f.text.as_bytes(), secs) {
                        self.write_message("time", &text);
                    }
                }
            }
            Event::Join { format, args } => {
                if let Some(f) = fmt(*format) {
                    let parts = join_parts(&f.args, args);
                    let sep = f.text.as_bytes();
                    let _ = match self.format {
                        OutputFormat::Text => {
                            self.out.write_all(&weft_output::join_line(&parts, sep))
                        }
                        OutputFormat::Json => {
                            self.out.write_all(&weft_output::json::join(&parts, sep))
                        }
                    };
                }
            }
            Event::Print { format, value } => {
                if let Some(ty) = fmt(*format).and_then(|f| f.args.first()) {
                    let text = match self.format {
                        // The value and its newline.
                        OutputFormat::Text => weft_output::print_value(ty, value, cx.resolver),
                        OutputFormat::Json => weft_output::json::value(ty, value, cx.resolver),
                    };
                    let _ = self.out.write_all(&text);
                }
            }
            Event::Map(m) => self.print_map(m, cx),
            // Not printed by bpftrace (losses are reported once, at the end).
            Event::Exit
            | Event::ProcessJoined { .. }
            | Event::ProcessLeft { .. }
            | Event::ThreadStarted
            | Event::ThreadEnded
            | Event::Lost { .. }
            // `weft record`'s events go to its file, not to the printer.
            | Event::FunctionEntry { .. }
            | Event::FunctionExit { .. }
            | Event::Function { .. }
            | Event::Functions { .. }
            | Event::Clock { .. }
            | Event::Site { .. } => {}
        }
    }

    /// Every map, as bpftrace prints them when it exits: the exit header (also
    /// when there is no map, and also with `-f json`), then each map in bpftrace's
    /// order.
    fn finish(&mut self, maps: &[MapSnapshot], cx: &Context<'_>) {
        // `config = { print_maps_on_exit = 0 }`: nothing at the end.
        if !cx.prog.config.print_maps_on_exit {
            return;
        }
        let header = weft_output::exit_header();
        if self.to_file {
            let _ = std::io::stdout().write_all(header.as_bytes());
        } else {
            let _ = self.out.write_all(header.as_bytes());
        }
        for i in weft_output::exit_order(&cx.prog.maps) {
            // Empty maps too: bpftrace prints their newline (and `@x: 0` for a
            // scalar count()).
            if let Some(m) = maps.iter().find(|m| m.map as usize == i) {
                self.print_map(m, cx);
            }
        }
    }

    fn flush(&mut self) {
        let _ = self.out.flush();
    }

    /// `Attached N probes` (text: on stderr, as upstream bpftrace; JSON: a record on
    /// the output).
    fn attached(&mut self, n: usize) {
        match self.format {
            OutputFormat::Text => eprint!("{}", weft_output::attached_line(n as u64)),
            OutputFormat::Json => {
                let _ = self
                    .out
                    .write_all(&weft_output::json::attached_probes(n as u64));
            }
        }
    }

    /// `Woven N call sites`, the same way.
    fn call_sites(&mut self, n: usize) {
        match self.format {
            OutputFormat::Text => eprint!("{}", weft_output::call_sites_line(n as u64)),
            OutputFormat::Json => {
                let _ = self.out.write_all(&weft_output::json::call_sites(n as u64));
            }
        }
    }
}

/// The strings of a `join()` payload (a tuple of strings).
fn join_parts(args: &[weft_ir::Type], payload: &[u8]) -> Vec<Vec<u8>> {
    let tuple = weft_ir::Type::Tuple(args.to_vec());
    let offs = tuple.field_offsets();
    args.iter()
        .zip(offs)
        .map(|(t, off)| {
            let off = off as usize;
            let end = (off + t.size() as usize).min(payload.len());
            let field = payload.get(off..end).unwrap_or(&[]);
            let n = field.iter().position(|&b| b == 0).unwrap_or(field.len());
            field[..n].to_vec()
        })
        .collect()
}

/// An IO error's message without Rust's ` (os error N)`: `No such file or directory`.
fn os_message(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.rfind(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_engine::segment::{Segment, Sizes};

    struct NoSymbols(Vec<weft_ir::Format>);

    impl weft_output::Resolver for NoSymbols {
        fn usym(&self, _: u64) -> Option<weft_output::Symbol> {
            None
        }
        fn probe_name(&self, id: u64) -> String {
            format!("probe{id}")
        }
        fn format(&self, id: weft_ir::FmtId) -> Option<&weft_ir::Format> {
            self.0.get(id.0 as usize)
        }
    }

    /// What `finish` writes at exit for `program` when no probe has run.
    fn exit_text(program: &str, format: OutputFormat) -> String {
        let out = weft_lang::compile(program, "-e", &weft_lang::Options::default());
        let prog = out.program.expect("program compiles");
        let seg = Segment::create(&prog, Sizes::default(), 0).unwrap();
        let mut text = Vec::new();
        let mut p = Printer {
            to_file: false,
            out: Box::new(&mut text),
            format,
            unsafe_ok: false,
            no_warnings: false,
        };
        let resolver = NoSymbols(prog.formats.clone());
        let cx = Context {
            prog: &prog,
            resolver: &resolver,
        };
        p.finish(&weft_trace::decode::all_maps(&seg.shm, &prog), &cx);
        drop(p);
        String::from_utf8(text).unwrap()
    }

    /// bpftrace 0.17 prints the two newlines at exit also without maps (and with
    /// `-f json`), and prints every map, an empty one as its newline.
    #[test]
    fn exit_prints_the_header_and_empty_maps() {
        let t = OutputFormat::Text;
        assert_eq!(exit_text("BEGIN { exit(); }", t), "\n\n");
        assert_eq!(exit_text("BEGIN { exit(); }", OutputFormat::Json), "\n\n");
        assert_eq!(
            exit_text("BEGIN { @b[1] = 1; @a = count(); @s = stats(1); }", t),
            "\n\n@a: 0\n\n\n\n"
        );
    }
}
