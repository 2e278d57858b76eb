//! Calls: a record file's function entries and exits (kinds 15 to 17) made into
//! the calls of each thread, for `weft replay`, `weft report` and `weft dump`.
//!
//! [`Walker`] is the one place that pairs entries with exits: fed records in file
//! order, it keeps each thread's stack of open calls and reports every entry and
//! every finished call as a [`Step`], with its depth, its callers, its duration and
//! its self time (its duration less its callees'). Pairing is by function: an exit
//! closes the latest open call of its function on its thread, and the calls above
//! it (left by `longjmp`, which has no exit) end there too, marked unfinished; an
//! exit with no open call of its function (a call entered before recording began)
//! is counted and dropped. Calls still open when the records end close at their
//! thread's last time, unfinished.
//!
//! On top of it: [`Tree`] (each thread's calls as trees, for replay), [`Totals`]
//! (per-function calls, total, self, min and max, for report) and the
//! uftrace-style duration text, [`duration`]. No IO.

use std::collections::HashMap;

use crate::event::{Event, Record};

/// A thread: (pid, tid).
pub type ThreadId = (u32, u32);

/// A call in progress on a thread's stack.
#[derive(Clone, Debug)]
struct Open {
    name: usize,
    func: u64,
    start: u64,
    args: Vec<u64>,
    /// Time spent in callees that have returned.
    callees: u64,
}

#[derive(Default, Debug)]
struct ThreadState {
    stack: Vec<Open>,
    /// The names of `stack`'s calls, outermost first.
    path: Vec<usize>,
    /// The thread's latest time.
    last: u64,
}

/// What the walker saw, in order.
#[derive(Debug)]
pub enum Step<'a> {
    /// A call began.
    Entry {
        /// The walker's names so far (see `name`).
        names: &'a [String],
        thread: ThreadId,
        /// Callers on the stack (0: outermost).
        depth: usize,
        /// An index into [`Walker::names`].
        name: usize,
        at: u64,
        args: &'a [u64],
    },
    /// A call ended.
    Exit {
        names: &'a [String],
        thread: ThreadId,
        depth: usize,
        name: usize,
        /// The callers' names, outermost first (`depth` of them).
        callers: &'a [usize],
        start: u64,
        end: u64,
        /// The duration less the callees' durations.
        self_ns: u64,
        args: &'a [u64],
        /// `None`: the call had no exit (left by `longjmp`, or still running when
        /// the records end).
        retval: Option<u64>,
    },
}

impl Step<'_> {
    /// The name of the call's function.
    pub fn name(&self) -> &str {
        match self {
            Step::Entry { names, name, .. } | Step::Exit { names, name, .. } => &names[*name],
        }
    }

    pub fn thread(&self) -> ThreadId {
        match self {
            Step::Entry { thread, .. } | Step::Exit { thread, .. } => *thread,
        }
    }
}

/// Pairs entries with exits, per thread. See the module's documentation.
#[derive(Default, Debug)]
pub struct Walker {
    /// Function names, by index (a function named in several processes, or at
    /// several addresses, has one index).
    pub names: Vec<String>,
    by_name: HashMap<String, usize>,
    funcs: HashMap<(u32, u64), usize>,
    threads: HashMap<ThreadId, ThreadState>,
    /// Threads in the order their first call came.
    pub order: Vec<ThreadId>,
    /// Each process's command name, when the records say it.
    pub comms: HashMap<u32, String>,
    /// Events the agent dropped (its rings were full).
    pub lost: u64,
    /// Exits without an open call of their function (dropped).
    pub orphan_exits: u64,
    /// Calls that ended without their exit.
    pub unfinished: u64,
}

impl Walker {
    pub fn new() -> Walker {
        Walker::default()
    }

    fn name_of(&mut self, pid: u32, func: u64) -> usize {
        if let Some(&n) = self.funcs.get(&(pid, func)) {
            return n;
        }
        let n = self.intern(&format!("{func:#x}"));
        self.funcs.insert((pid, func), n);
        n
    }

    fn intern(&mut self, name: &str) -> usize {
        if let Some(&n) = self.by_name.get(name) {
            return n;
        }
        self.names.push(name.to_string());
        self.by_name.insert(name.to_string(), self.names.len() - 1);
        self.names.len() - 1
    }

    /// Takes one record; `step` hears what it started or ended.
    pub fn feed(&mut self, r: &Record, step: &mut impl FnMut(Step<'_>)) {
        let thread = (r.pid, r.tid);
        match &r.event {
            Event::Function { func, name } => {
                let n = self.intern(name);
                self.funcs.insert((r.pid, *func), n);
            }
            Event::ProcessJoined { pid, comm } => {
                self.comms.insert(*pid, comm.clone());
            }
            Event::Lost { events } => self.lost += events,
            Event::FunctionEntry { func, args } => {
                let name = self.name_of(r.pid, *func);
                let Walker {
                    names,
                    threads,
                    order,
                    ..
                } = self;
                let t = threads.entry(thread).or_insert_with(|| {
                    order.push(thread);
                    ThreadState::default()
                });
                t.last = t.last.max(r.nsecs);
                let depth = t.stack.len();
                t.stack.push(Open {
                    name,
                    func: *func,
                    start: r.nsecs,
                    args: args.clone(),
                    callees: 0,
                });
                t.path.push(name);
                step(Step::Entry {
                    names,
                    thread,
                    depth,
                    name,
                    at: r.nsecs,
                    args,
                });
            }
            Event::FunctionExit { func, retval } => {
                let Some(t) = self.threads.get_mut(&thread) else {
                    self.orphan_exits += 1;
                    return;
                };
                t.last = t.last.max(r.nsecs);
                let Some(at) = t.stack.iter().rposition(|o| o.func == *func) else {
                    self.orphan_exits += 1;
                    return;
                };
                while t.stack.len() > at + 1 {
                    self.unfinished += 1;
                    close(&self.names, thread, t, r.nsecs, None, step);
                }
                close(&self.names, thread, t, r.nsecs, Some(*retval), step);
            }
            _ => {}
        }
    }

    /// The records ended: calls still open close at their thread's last time.
    pub fn finish(&mut self, step: &mut impl FnMut(Step<'_>)) {
        for id in &self.order {
            let t = self.threads.get_mut(id).expect("ordered threads exist");
            while !t.stack.is_empty() {
                self.unfinished += 1;
                let last = t.last;
                close(&self.names, *id, t, last, None, step);
            }
        }
    }
}

/// Ends the thread's innermost call at `end`.
fn close(
    names: &[String],
    thread: ThreadId,
    t: &mut ThreadState,
    end: u64,
    retval: Option<u64>,
    step: &mut impl FnMut(Step<'_>),
) {
    let o = t.stack.pop().expect("a call to close");
    t.path.pop();
    let dur = end.saturating_sub(o.start);
    if let Some(parent) = t.stack.last_mut() {
        parent.callees += dur;
    }
    step(Step::Exit {
        names,
        thread,
        depth: t.stack.len(),
        name: o.name,
        callers: &t.path,
        start: o.start,
        end,
        self_ns: dur.saturating_sub(o.callees),
        args: &o.args,
        retval,
    });
}

/// A finished call and its callees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// An index into the walker's names.
    pub name: usize,
    pub start: u64,
    pub end: u64,
    pub args: Vec<u64>,
    /// `None`: no exit was recorded (see [`Step::Exit`]).
    pub retval: Option<u64>,
    pub children: Vec<Call>,
}

impl Call {
    pub fn duration(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// A thread's calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadCalls {
    pub pid: u32,
    pub tid: u32,
    /// Its outermost calls, in time order.
    pub calls: Vec<Call>,
}

/// Every thread's calls as trees, threads in the order they first called.
#[derive(Default, Debug)]
pub struct Tree {
    open: HashMap<ThreadId, Vec<Call>>,
    done: HashMap<ThreadId, Vec<Call>>,
    order: Vec<ThreadId>,
}

impl Tree {
    pub fn new() -> Tree {
        Tree::default()
    }

    /// Takes a walker's step.
    pub fn step(&mut self, s: Step<'_>) {
        match s {
            Step::Entry {
                thread,
                name,
                at,
                args,
                ..
            } => {
                if let std::collections::hash_map::Entry::Vacant(e) = self.done.entry(thread) {
                    e.insert(Vec::new());
                    self.order.push(thread);
                }
                self.open.entry(thread).or_default().push(Call {
                    name,
                    start: at,
                    end: at,
                    args: args.to_vec(),
                    retval: None,
                    children: Vec::new(),
                });
            }
            Step::Exit {
                thread,
                end,
                retval,
                ..
            } => {
                let stack = self
                    .open
                    .get_mut(&thread)
                    .expect("an exit follows its entry");
                let mut c = stack.pop().expect("an exit follows its entry");
                c.end = end;
                c.retval = retval;
                match stack.last_mut() {
                    Some(parent) => parent.children.push(c),
                    None => self.done.get_mut(&thread).expect("entered").push(c),
                }
            }
        }
    }

    /// The trees (after the walker's [`Walker::finish`]).
    pub fn threads(mut self) -> Vec<ThreadCalls> {
        self.order
            .iter()
            .map(|&(pid, tid)| ThreadCalls {
                pid,
                tid,
                calls: self.done.remove(&(pid, tid)).unwrap_or_default(),
            })
            .collect()
    }
}

/// What replay shows of the trees.
pub struct Filter<'a> {
    /// Show callees this deep at most (1: the outermost calls only).
    pub depth: Option<usize>,
    /// Show only the calls whose name this accepts, with their callees (outermost
    /// matches become the outermost calls shown).
    pub only: Option<&'a dyn Fn(&str) -> bool>,
    /// Hide the calls whose name this accepts, with their callees.
    pub hide: Option<&'a dyn Fn(&str) -> bool>,
    /// Hide the calls shorter than this (ns).
    pub min_duration: u64,
}

impl Filter<'_> {
    /// The calls of `calls` to show, outermost first (borrowed; callees are
    /// filtered by [`Filter::children`] as they are shown).
    pub fn roots<'c>(&self, calls: &'c [Call], names: &[String]) -> Vec<&'c Call> {
        let mut out = Vec::new();
        for c in calls {
            self.collect_roots(c, names, &mut out);
        }
        out
    }

    fn collect_roots<'c>(&self, c: &'c Call, names: &[String], out: &mut Vec<&'c Call>) {
        if self.hidden(c, names) {
            return;
        }
        match self.only {
            Some(only) if !only(&names[c.name]) => {
                for child in &c.children {
                    self.collect_roots(child, names, out);
                }
            }
            _ => out.push(c),
        }
    }

    fn hidden(&self, c: &Call, names: &[String]) -> bool {
        c.duration() < self.min_duration || self.hide.is_some_and(|h| h(&names[c.name]))
    }

    /// The callees of `c` to show, `c` being shown at `depth` (0: outermost).
    pub fn children<'c>(&self, c: &'c Call, depth: usize, names: &[String]) -> Vec<&'c Call> {
        if self.depth.is_some_and(|d| depth + 1 >= d) {
            return Vec::new();
        }
        c.children
            .iter()
            .filter(|k| !self.hidden(k, names))
            .collect()
    }
}

/// One function's totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FunctionTotals {
    pub calls: u64,
    /// The sum of the calls' durations (a recursive call counts in its caller's too).
    pub total: u64,
    /// The sum of the calls' durations less their callees'.
    pub self_ns: u64,
    pub min: u64,
    pub max: u64,
}

impl FunctionTotals {
    pub fn avg(&self) -> u64 {
        self.total.checked_div(self.calls).unwrap_or(0)
    }
}

/// Per-function totals over the calls a walker reports.
#[derive(Default, Debug)]
pub struct Totals {
    /// By name index.
    pub functions: HashMap<usize, FunctionTotals>,
}

impl Totals {
    pub fn new() -> Totals {
        Totals::default()
    }

    pub fn step(&mut self, s: &Step<'_>) {
        if let Step::Exit {
            name,
            start,
            end,
            self_ns,
            ..
        } = s
        {
            let d = end.saturating_sub(*start);
            let f = self.functions.entry(*name).or_default();
            if f.calls == 0 || d < f.min {
                f.min = d;
            }
            f.max = f.max.max(d);
            f.calls += 1;
            f.total += d;
            f.self_ns += self_ns;
        }
    }
}

/// A duration as uftrace prints it: `  1.234 us`, ` 12.345 ms`, `  1.000  s`
/// (three digits of the next smaller unit; minutes and hours keep the seconds
/// and minutes after the point).
pub fn duration(ns: u64) -> String {
    const UNITS: [&str; 5] = ["us", "ms", " s", " m", " h"];
    const LIMIT: [u64; 6] = [1000, 1000, 1000, 60, 24, u64::MAX];
    let mut whole = ns;
    let mut idx = 0;
    let small = loop {
        let small = whole % LIMIT[idx];
        whole /= LIMIT[idx];
        if whole < LIMIT[idx + 1] || idx == UNITS.len() - 1 {
            break small;
        }
        idx += 1;
    };
    format!("{whole:3}.{small:03} {}", UNITS[idx])
}

/// An integer argument or return value as replay prints it: signed decimal when
/// it is small, hex otherwise (a pointer).
pub fn value(v: u64) -> String {
    let s = v as i64;
    if (-(1 << 31)..(1 << 32)).contains(&s) {
        s.to_string()
    } else {
        format!("{v:#x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(nsecs: u64, tid: u32, event: Event) -> Record {
        Record {
            nsecs,
            pid: 1,
            tid,
            event,
        }
    }

    fn entry(nsecs: u64, tid: u32, func: u64) -> Record {
        rec(
            nsecs,
            tid,
            Event::FunctionEntry {
                func,
                args: vec![func],
            },
        )
    }

    fn exit(nsecs: u64, tid: u32, func: u64) -> Record {
        rec(
            nsecs,
            tid,
            Event::FunctionExit {
                func,
                retval: func * 10,
            },
        )
    }

    fn named(func: u64, name: &str) -> Record {
        rec(
            0,
            1,
            Event::Function {
                func,
                name: name.into(),
            },
        )
    }

    /// main(1) → a(2) → b(3) ×2, main → c(4); thread 2: d(5), and an exit of a
    /// call entered before the records began.
    fn records() -> Vec<Record> {
        let mut v: Vec<Record> = [(1, "main"), (2, "a"), (3, "b"), (4, "c"), (5, "d")]
            .iter()
            .map(|&(f, n)| named(f, n))
            .collect();
        v.extend([
            entry(100, 1, 1),
            entry(110, 1, 2),
            entry(120, 1, 3),
            exit(130, 1, 3),
            entry(140, 1, 3),
            exit(160, 1, 3),
            exit(170, 1, 2),
            exit(171, 2, 5),
            entry(172, 2, 5),
            entry(180, 1, 4),
            exit(181, 2, 5),
            exit(190, 1, 4),
            exit(200, 1, 1),
        ]);
        v
    }

    fn walk(records: &[Record]) -> (Walker, Vec<ThreadCalls>, Totals) {
        let mut w = Walker::new();
        let (mut tree, mut totals) = (Tree::new(), Totals::new());
        let mut step = |s: Step<'_>| {
            totals.step(&s);
            tree.step(s);
        };
        for r in records {
            w.feed(r, &mut step);
        }
        w.finish(&mut step);
        (w, tree.threads(), totals)
    }

    fn shape(c: &Call, names: &[String]) -> String {
        let kids: Vec<String> = c.children.iter().map(|k| shape(k, names)).collect();
        if kids.is_empty() {
            names[c.name].clone()
        } else {
            format!("{}({})", names[c.name], kids.join(" "))
        }
    }

    #[test]
    fn entries_and_exits_become_each_threads_trees() {
        let (w, threads, _) = walk(&records());
        assert_eq!(threads.len(), 2);
        assert_eq!((threads[0].tid, threads[1].tid), (1, 2));
        let main = &threads[0].calls[0];
        assert_eq!(shape(main, &w.names), "main(a(b b) c)");
        assert_eq!((main.start, main.end, main.retval), (100, 200, Some(10)));
        assert_eq!(main.children[0].children[1].args, [3]);
        assert_eq!(shape(&threads[1].calls[0], &w.names), "d");
        assert_eq!((w.orphan_exits, w.unfinished), (1, 0));
    }

    #[test]
    fn totals_count_calls_and_self_time() {
        let (w, _, t) = walk(&records());
        let get = |n: &str| t.functions[&w.names.iter().position(|x| x == n).unwrap()].clone();
        let b = get("b");
        assert_eq!(
            (b.calls, b.total, b.self_ns, b.min, b.max),
            (2, 30, 30, 10, 20)
        );
        let a = get("a");
        assert_eq!((a.calls, a.total, a.self_ns), (1, 60, 30));
        let main = get("main");
        assert_eq!((main.total, main.self_ns), (100, 100 - 60 - 10));
        assert_eq!(get("d").calls, 1);
    }

    #[test]
    fn calls_without_an_exit_end_unfinished() {
        let mut r = records();
        // longjmp out of the second b into main: it and a have no exit, so c is
        // seen as b's callee, and main's exit ends them.
        r.retain(|x| x.nsecs != 160 && x.nsecs != 170);
        let (w, threads, _) = walk(&r);
        let main = &threads[0].calls[0];
        assert_eq!(shape(main, &w.names), "main(a(b b(c)))");
        assert_eq!(main.retval, Some(10));
        let a = &main.children[0];
        assert_eq!((a.end, a.retval), (200, None));
        assert_eq!(w.unfinished, 2);
        // And main still running when the records end: it ends at its thread's
        // last time.
        r.retain(|x| x.nsecs != 200);
        let (w, threads, _) = walk(&r);
        let main = &threads[0].calls[0];
        assert_eq!((main.end, main.retval), (190, None));
        assert_eq!(w.unfinished, 3);
    }

    #[test]
    fn filters_pick_depth_functions_and_durations() {
        let (w, threads, _) = walk(&records());
        let calls = &threads[0].calls;
        let show = |f: &Filter<'_>| {
            fn one(f: &Filter<'_>, c: &Call, d: usize, names: &[String]) -> String {
                let kids: Vec<String> = f
                    .children(c, d, names)
                    .into_iter()
                    .map(|k| one(f, k, d + 1, names))
                    .collect();
                if kids.is_empty() {
                    names[c.name].clone()
                } else {
                    format!("{}({})", names[c.name], kids.join(" "))
                }
            }
            f.roots(calls, &w.names)
                .into_iter()
                .map(|c| one(f, c, 0, &w.names))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let none = Filter {
            depth: None,
            only: None,
            hide: None,
            min_duration: 0,
        };
        assert_eq!(show(&none), "main(a(b b) c)");
        assert_eq!(
            show(&Filter {
                depth: Some(2),
                ..none
            }),
            "main(a c)"
        );
        let is_a = |n: &str| n == "a";
        assert_eq!(
            show(&Filter {
                only: Some(&is_a),
                ..none
            }),
            "a(b b)"
        );
        assert_eq!(
            show(&Filter {
                hide: Some(&is_a),
                ..none
            }),
            "main(c)"
        );
        assert_eq!(
            show(&Filter {
                min_duration: 15,
                ..none
            }),
            "main(a(b))"
        );
    }

    #[test]
    fn durations_read_as_uftrace_prints_them() {
        assert_eq!(duration(0), "  0.000 us");
        assert_eq!(duration(1_502), "  1.502 us");
        assert_eq!(duration(417_149), "417.149 us");
        assert_eq!(duration(1_234_567), "  1.234 ms");
        assert_eq!(duration(12_345_678_901), " 12.345  s");
        assert_eq!(duration(61_000_000_000), "  1.001  m");
        assert_eq!(value(42), "42");
        assert_eq!(value(-2i64 as u64), "-2");
        assert_eq!(value(0x7ffd_8d14_4038), "0x7ffd8d144038");
    }
}
