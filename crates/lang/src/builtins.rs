//! Every builtin function, aggregation and variable of the language, in one table.
//!
//! The checker reads here whether a name is known (and what to suggest when it is
//! not), how many arguments a call takes, which argument is a map reference rather
//! than a read, whether it has a value, in which probes it may be used, and whether
//! it needs `--unsafe`; lowering reads which calls are events weft handles. What a
//! builtin computes (its type rules, its code) stays with the checker's and
//! lowering's arm for it: a new builtin is one entry here plus those arms.

/// What a name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `f(...)`.
    Function,
    /// `@m[...] = f(...)`: only assigned to a map.
    Aggregation,
    /// A bare name (`pid`, `retval`); `argN` stands for `arg0`, `arg1`, ...
    Variable,
}

/// The probes a builtin may be used in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    Anywhere,
    /// Probes that run in the target (uprobe, uretprobe, usdt, profile).
    InTarget,
    /// Probes that run in the target, and kernel probes (for the thread that
    /// made the event: `ustack`).
    InTargetOrKernel,
    /// Probes that run in user space: any but kernel probes (tracepoints).
    UserSpace,
    /// uprobe, uretprobe and call.
    FunctionProbes,
    /// uprobe, usdt and call.
    ArgumentProbes,
    /// call (a call site's own values: `caller`).
    CallProbes,
    /// uretprobe.
    ReturnProbes,
    /// uprobe.
    EntryProbes,
    /// Data probes (`set:`, `get:`, `watchpoint:`).
    DataProbes,
    /// Data probes on writes (`set:`, `watchpoint:...:w`).
    SetProbes,
    /// Function probes and data probes (`func`: the accessing code's function).
    CodeProbes,
}

impl Where {
    /// As the checker's messages say it.
    pub fn describe(self) -> &'static str {
        match self {
            Where::Anywhere => "any probe",
            Where::InTarget => "probes that run in the target",
            Where::InTargetOrKernel => "probes that run in the target and kernel probes",
            Where::UserSpace => "probes that run in user space",
            Where::FunctionProbes => "uprobe, uretprobe and call probes",
            Where::ArgumentProbes => "uprobe, usdt and call probes",
            Where::CallProbes => "call probes",
            Where::ReturnProbes => "uretprobe probes",
            Where::EntryProbes => "uprobe probes",
            Where::DataProbes => "set, get and watchpoint probes",
            Where::SetProbes => "set probes (write watchpoints)",
            Where::CodeProbes => "uprobe, uretprobe, call, set, get and watchpoint probes",
        }
    }
}

/// Where a builtin's work is done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runs {
    /// In the advice, wherever it runs.
    Advice,
    /// By weft, from an event the advice emits (printing, files, commands).
    Weft,
}

/// One builtin.
#[derive(Clone, Copy, Debug)]
pub struct Builtin {
    pub name: &'static str,
    pub form: Form,
    /// Arguments taken (`usize::MAX`: any number from `min_args`).
    pub min_args: usize,
    pub max_args: usize,
    /// The first argument is a map itself (`print(@m)`, `delete(@m[k])`), not a
    /// read of it.
    pub map_first: bool,
    /// Has no value: a statement only.
    pub void: bool,
    pub only: Where,
    pub runs: Runs,
    /// Allowed only with `--unsafe`.
    pub needs_unsafe: bool,
    /// Written by weft's own commands (`weft record`), not offered to users: left
    /// out of suggestions and listings.
    pub hidden: bool,
}

const fn f(name: &'static str, min_args: usize, max_args: usize) -> Builtin {
    Builtin {
        name,
        form: Form::Function,
        min_args,
        max_args,
        map_first: false,
        void: false,
        only: Where::Anywhere,
        runs: Runs::Advice,
        needs_unsafe: false,
        hidden: false,
    }
}

const fn agg(name: &'static str, min_args: usize, max_args: usize) -> Builtin {
    Builtin {
        form: Form::Aggregation,
        ..f(name, min_args, max_args)
    }
}

const fn var(name: &'static str) -> Builtin {
    Builtin {
        form: Form::Variable,
        ..f(name, 0, 0)
    }
}

impl Builtin {
    /// An action weft carries out (no value).
    const fn action(self) -> Builtin {
        Builtin {
            void: true,
            runs: Runs::Weft,
            ..self
        }
    }
    const fn map_first(self) -> Builtin {
        Builtin {
            map_first: true,
            ..self
        }
    }
    const fn only(self, only: Where) -> Builtin {
        Builtin { only, ..self }
    }
    const fn hidden(self) -> Builtin {
        Builtin {
            hidden: true,
            ..self
        }
    }
    const fn unsafe_only(self) -> Builtin {
        Builtin {
            needs_unsafe: true,
            ..self
        }
    }

    /// As messages name it: `f()` for a function, the bare name for a variable
    /// (and for `ustack`, which is both).
    pub fn shown(&self) -> String {
        if self.name == "__weft_set_new" {
            return "assigning `new`".to_string();
        }
        if self.form == Form::Variable || variable(self.name).is_some() {
            self.name.to_string()
        } else {
            format!("{}()", self.name)
        }
    }
}

const ANY: usize = usize::MAX;

/// The table.
pub static TABLE: &[Builtin] = &[
    // Output and actions: events weft handles.
    f("printf", 1, ANY).action(),
    f("errorf", 1, ANY).action(),
    f("warnf", 1, ANY).action(),
    f("pcomm", 0, 0),
    f("print", 1, 3).action().map_first(),
    f("exit", 0, 1).action(),
    f("clear", 1, 1).action().map_first(),
    f("zero", 1, 1).action().map_first(),
    f("time", 0, 1).action(),
    f("join", 1, 2).action(),
    f("system", 1, ANY).action().unsafe_only(),
    f("cat", 1, ANY).action(),
    // `weft record`'s function entry (with its first N arguments, N a constant
    // 0..=6) and exit events.
    // A second argument: a counter's value, recorded after the arguments
    // (`weft fperf`); `__weft_exit(VALUE)` records it in place of the return value.
    f("__weft_entry", 1, 2)
        .action()
        .only(Where::EntryProbes)
        .hidden(),
    f("__weft_exit", 0, 1)
        .action()
        .only(Where::ReturnProbes)
        .hidden(),
    // `cflow`'s per-thread state (`crate::cflow`): this thread's accumulator of a
    // `sum()` map without keys, and whether the return address at a function's
    // entry lies in the function FUNC of BIN.
    f("__weft_thread", 1, 1)
        .map_first()
        .only(Where::UserSpace)
        .hidden(),
    f("__weft_caller_in", 2, 2)
        .only(Where::EntryProbes)
        .hidden(),
    // A recursive `fn` called deeper than weft inlines it (`crate::func`): the
    // probe stops there (its value, an `int64`, is never used).
    f("__weft_stop", 0, 0).hidden(),
    // `weft stap`'s sorted `foreach` on strings: -1, 0 or 1, bytewise.
    f("__weft_strorder", 2, 2).only(Where::UserSpace).hidden(),
    // Around advice: call the original function (with new first arguments).
    f("proceed", 0, 6).only(Where::InTarget),
    // A return probe: replace the function's return value.
    Builtin {
        void: true,
        ..f("override", 1, 1).only(Where::ReturnProbes).unsafe_only()
    },
    // A set probe: `new = EXPR` (the parser's spelling of it) changes the value
    // written.
    Builtin {
        void: true,
        ..f("__weft_set_new", 1, 1)
            .only(Where::SetProbes)
            .unsafe_only()
            .hidden()
    },
    // A signal to the thread that hit the probe, from the advice.
    Builtin {
        void: true,
        ..f("signal", 1, 1).only(Where::InTarget).unsafe_only()
    },
    // Values.
    f("str", 1, 2),
    f("buf", 1, 2),
    f("delete", 1, 2).map_first(),
    f("has_key", 2, ANY).map_first(),
    f("len", 1, 1).map_first(),
    f("strftime", 2, 2),
    f("usym", 1, 1).only(Where::UserSpace),
    f("uaddr", 1, 1).only(Where::UserSpace),
    f("ustack", 0, 2).only(Where::InTargetOrKernel),
    f("strncmp", 3, 3),
    f("strcontains", 2, 2),
    f("bswap", 1, 1),
    f("strerror", 1, 1),
    f("getopt", 1, 3),
    f("ntop", 1, 2),
    f("pton", 1, 1),
    f("macaddr", 1, 1),
    f("reg", 1, 1).only(Where::InTarget),
    // Parsed as expressions of their own (`sizeof(T)`, `offsetof(T, f)`).
    f("sizeof", 1, 1),
    f("offsetof", 2, 2),
    // Aggregations.
    agg("count", 0, 0),
    agg("sum", 1, 1),
    agg("min", 1, 1),
    agg("max", 1, 1),
    agg("avg", 1, 1),
    agg("stats", 1, 1),
    agg("hist", 1, 2),
    agg("lhist", 4, 4),
    agg("tseries", 3, 4),
    // Variables.
    var("pid"),
    var("tid"),
    var("uid"),
    var("gid"),
    var("nsecs"),
    var("elapsed"),
    // The thread's CPU time, ns (`weft fperf -e cputime`; a system call a read).
    var("__weft_cputime").only(Where::InTarget).hidden(),
    // The thread's page faults (all, minor, major) and context switches
    // (`weft fperf -e page-faults`...; getrusage, a system call a read).
    var("__weft_faults").only(Where::InTarget).hidden(),
    var("__weft_minflt").only(Where::InTarget).hidden(),
    var("__weft_majflt").only(Where::InTarget).hidden(),
    var("__weft_csw").only(Where::InTarget).hidden(),
    var("cpu"),
    var("numaid"),
    var("ncpus"),
    var("usermode"),
    var("cpid"),
    var("rand"),
    var("comm"),
    var("pcomm"),
    var("func").only(Where::CodeProbes),
    // Data probes: the value before and after a write, the value read, and the
    // address after the accessing instruction.
    var("old").only(Where::SetProbes),
    var("new").only(Where::SetProbes),
    var("val").only(Where::DataProbes),
    var("ip").only(Where::DataProbes),
    // The function that contains a call site (`call:` probes).
    var("caller").only(Where::CallProbes),
    var("probe"),
    var("retval").only(Where::ReturnProbes),
    var("args"),
    var("ustack").only(Where::InTargetOrKernel),
    var("argN").only(Where::ArgumentProbes),
];

/// The function or aggregation `name`.
pub fn function(name: &str) -> Option<&'static Builtin> {
    TABLE
        .iter()
        .find(|b| b.form != Form::Variable && b.name == name)
}

/// The variable `name` (`arg0`, `arg1`, ... are `argN`).
pub fn variable(name: &str) -> Option<&'static Builtin> {
    let name = match name.strip_prefix("arg") {
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => "argN",
        _ => name,
    };
    TABLE
        .iter()
        .find(|b| b.form == Form::Variable && b.name == name)
}

/// Whether `name` is an aggregation.
pub fn is_aggregation(name: &str) -> bool {
    function(name).is_some_and(|b| b.form == Form::Aggregation)
}

/// Names of every function and aggregation (for suggestions).
pub fn function_names() -> impl Iterator<Item = &'static str> {
    TABLE
        .iter()
        .filter(|b| b.form != Form::Variable && !b.hidden)
        .map(|b| b.name)
}

/// Names of every variable, `arg0` to `arg5` for `argN` (for suggestions).
pub fn variable_names() -> impl Iterator<Item = &'static str> {
    TABLE
        .iter()
        .filter(|b| b.form == Form::Variable && b.name != "argN")
        .map(|b| b.name)
        .chain(["arg0", "arg1", "arg2", "arg3", "arg4", "arg5"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_per_form() {
        for (i, a) in TABLE.iter().enumerate() {
            for b in &TABLE[i + 1..] {
                let both_functions = a.form != Form::Variable && b.form != Form::Variable;
                let both_variables = a.form == Form::Variable && b.form == Form::Variable;
                assert!(
                    a.name != b.name || !(both_functions || both_variables),
                    "{} twice",
                    a.name
                );
            }
        }
    }

    #[test]
    fn lookups() {
        assert_eq!(variable("arg12").map(|b| b.name), Some("argN"));
        assert!(variable("argx").is_none());
        assert!(is_aggregation("lhist") && !is_aggregation("printf"));
        assert_eq!(
            function("signal").map(Builtin::shown),
            Some("signal()".into())
        );
        assert_eq!(
            function("ustack").map(Builtin::shown),
            Some("ustack".into())
        );
        assert!(function("system").is_some_and(|b| b.needs_unsafe && b.void));
        assert!(function_names().any(|n| n == "count"));
        assert!(variable_names().any(|n| n == "arg5"));
    }
}
