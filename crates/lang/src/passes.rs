//! The front end as an ordered list of named stages. The driver runs them in order
//! and stops after the first stage that reported an error; `-d STAGE` dumps the
//! program after a stage.

/// A stage of the front end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Text to syntax tree (`-d ast`).
    Parse,
    /// Macro expansion.
    Expand,
    /// Names and types (`-d checked`: the tree with each expression's type).
    Check,
    /// Checked tree to probe program (`-d program`).
    Lower,
}

/// The stages in the order they run.
pub const PASSES: &[Stage] = &[Stage::Parse, Stage::Expand, Stage::Check, Stage::Lower];

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Parse => "parse",
            Stage::Expand => "expand",
            Stage::Check => "check",
            Stage::Lower => "lower",
        }
    }

    /// The stage a `-d NAME` flag refers to: `ast`, `expanded`, `checked`, `program`
    /// (or a stage name).
    pub fn from_dump_name(name: &str) -> Option<Stage> {
        Some(match name {
            "ast" | "parse" => Stage::Parse,
            "expanded" | "expand" => Stage::Expand,
            "checked" | "check" => Stage::Check,
            "program" | "lower" | "ir" => Stage::Lower,
            _ => return None,
        })
    }
}
