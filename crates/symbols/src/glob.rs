//! Wildcard patterns as bpftrace uses them in attach points, and "did you mean"
//! suggestions.
//!
//! * `*` matches any run of characters (including none), `?` exactly one;
//! * `[abc]`, `[a-z]` match one character of the set, `[!a-z]` / `[^a-z]` one not in it;
//! * everything else matches itself. A `[` without its `]` is an ordinary character.
//!
//! A pattern with none of `*`, `?`, `[` is an exact match. A pattern whose `[` is part
//! of a name (C++ `operator[]`, `f[abi:cxx11]`) also matches that name literally.

/// A compiled wildcard pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob {
    text: String,
    tokens: Vec<Token>,
    /// The same pattern with every `[` taken literally (when it has one).
    literal_brackets: Option<Vec<Token>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Char(char),
    Any,
    Star,
    Class {
        negated: bool,
        items: Vec<(char, char)>,
    },
}

/// True when `pattern` holds `*`, `?` or `[`.
pub fn has_wildcards(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

impl Glob {
    /// Compiles a pattern; never fails (malformed classes are literal text).
    pub fn new(pattern: &str) -> Glob {
        let literal_brackets = pattern.contains('[').then(|| tokenize(pattern, false));
        Glob {
            text: pattern.to_string(),
            tokens: tokenize(pattern, true),
            literal_brackets,
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when the pattern has no wildcards (an exact name).
    pub fn is_literal(&self) -> bool {
        !has_wildcards(&self.text)
    }

    /// Does `name` match? A `[` that fails as a class is also tried as itself.
    pub fn matches(&self, name: &str) -> bool {
        if self.is_literal() || name == self.text {
            return name == self.text;
        }
        let s: Vec<char> = name.chars().collect();
        match_tokens(&self.tokens, &s)
            || self
                .literal_brackets
                .as_ref()
                .is_some_and(|t| match_tokens(t, &s))
    }
}

fn tokenize(pattern: &str, classes: bool) -> Vec<Token> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => {
                if tokens.last() != Some(&Token::Star) {
                    tokens.push(Token::Star);
                }
                i += 1;
            }
            '?' => {
                tokens.push(Token::Any);
                i += 1;
            }
            '[' if classes => match parse_class(&chars[i + 1..]) {
                Some((token, used)) => {
                    tokens.push(token);
                    i += 1 + used;
                }
                None => {
                    tokens.push(Token::Char('['));
                    i += 1;
                }
            },
            c => {
                tokens.push(Token::Char(c));
                i += 1;
            }
        }
    }
    tokens
}

/// Wildcard matching with backtracking to the last `*` only (linear-ish).
fn match_tokens(t: &[Token], s: &[char]) -> bool {
    {
        let (mut si, mut ti) = (0usize, 0usize);
        let mut star: Option<(usize, usize)> = None; // (token after star, string pos)
        while si < s.len() {
            if ti < t.len() {
                match &t[ti] {
                    Token::Star => {
                        star = Some((ti + 1, si));
                        ti += 1;
                        continue;
                    }
                    tok if one_matches(tok, s[si]) => {
                        si += 1;
                        ti += 1;
                        continue;
                    }
                    _ => {}
                }
            }
            match star {
                Some((after, pos)) => {
                    ti = after;
                    si = pos + 1;
                    star = Some((after, pos + 1));
                }
                None => return false,
            }
        }
        t[ti..].iter().all(|tok| *tok == Token::Star)
    }
}

fn one_matches(tok: &Token, c: char) -> bool {
    match tok {
        Token::Char(x) => *x == c,
        Token::Any => true,
        Token::Star => false,
        Token::Class { negated, items } => {
            items.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated
        }
    }
}

/// Parses the inside of `[...]` (after the `[`); returns the token and the number of
/// characters used including the closing `]`.
fn parse_class(chars: &[char]) -> Option<(Token, usize)> {
    let mut i = 0;
    let negated = matches!(chars.first(), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut items = Vec::new();
    let mut first = true;
    while i < chars.len() {
        let c = chars[i];
        if c == ']' && !first {
            return Some((Token::Class { negated, items }, i + 1));
        }
        first = false;
        if i + 2 < chars.len() && chars[i + 1] == '-' && chars[i + 2] != ']' {
            let (lo, hi) = (c, chars[i + 2]);
            items.push((lo.min(hi), lo.max(hi)));
            i += 3;
        } else {
            items.push((c, c));
            i += 1;
        }
    }
    None
}

/// Edit distance between two strings (by characters): insertions, deletions,
/// substitutions and swaps of neighbours each cost 1 (optimal string alignment).
/// `None` once it is certain to exceed `limit`.
pub fn edit_distance(a: &str, b: &str, limit: usize) -> Option<usize> {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    if a.len().abs_diff(b.len()) > limit {
        return None;
    }
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    let mut prev_min = 0;
    for i in 1..=a.len() {
        cur[0] = i;
        let mut row_min = cur[0];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(before[j - 2] + 1);
            }
            cur[j] = d;
            row_min = row_min.min(d);
        }
        // A later row can only come back under the limit through a swap, which
        // costs 1 more than a cell of the row before this one.
        if row_min > limit && prev_min >= limit {
            return None;
        }
        prev_min = row_min;
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    let d = prev[b.len()];
    (d <= limit).then_some(d)
}

/// Up to three names from `candidates` close to `wanted`, closest first (ties in
/// name order). Close means an edit distance of at most a third of the name (at
/// least 1, at most 4), or a case-insensitive match.
pub fn suggest<'a>(wanted: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let limit = (wanted.chars().count() / 3).clamp(1, 4);
    let lower = wanted.to_lowercase();
    let mut scored: Vec<(usize, &str)> = Vec::new();
    for c in candidates {
        if c == wanted {
            continue;
        }
        let d = if c.to_lowercase() == lower {
            Some(0)
        } else {
            edit_distance(wanted, c, limit)
        };
        if let Some(d) = d {
            scored.push((d, c));
        }
    }
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored
        .into_iter()
        .take(3)
        .map(|(_, c)| c.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_table() {
        let table: &[(&str, &str, bool)] = &[
            ("main", "main", true),
            ("main", "main2", false),
            ("main", "mai", false),
            ("*", "", true),
            ("*", "anything", true),
            ("ma*", "main", true),
            ("ma*", "ma", true),
            ("ma*", "xmain", false),
            ("*in", "main", true),
            ("*in", "mains", false),
            ("*a*i*", "main", true),
            ("*a*i*", "mn", false),
            ("m?in", "main", true),
            ("m?in", "min", false),
            ("m??n", "moon", true),
            ("[mp]ain", "main", true),
            ("[mp]ain", "pain", true),
            ("[mp]ain", "rain", false),
            ("[a-c]x", "bx", true),
            ("[a-c]x", "dx", false),
            ("[!a-c]x", "dx", true),
            ("[!a-c]x", "ax", false),
            ("[^a-c]x", "ax", false),
            ("f[0-9][0-9]", "f42", true),
            ("f[0-9][0-9]", "f4", false),
            ("[]]x", "]x", true),
            ("a[b", "a[b", true),
            ("a[b*", "a[bcd", true),
            ("operator[]", "operator[]", true),
            ("*[abi:cxx11]()", "f[abi:cxx11]()", true),
            ("foo::*", "foo::bar(int)", true),
            ("*::bar*", "foo::bar(int)", true),
            ("_Z*", "_ZN3foo3barEi", true),
            ("**x", "abx", true),
            ("*x*y", "axbxcy", true),
            ("*x*y", "axbxc", false),
            ("é*", "éa", true),
        ];
        for &(pat, name, want) in table {
            assert_eq!(Glob::new(pat).matches(name), want, "{pat:?} vs {name:?}");
        }
    }

    #[test]
    fn literal_patterns() {
        assert!(Glob::new("parse").is_literal());
        assert!(!Glob::new("pa*").is_literal());
        assert!(!Glob::new("p[a]").is_literal());
        assert!(!has_wildcards("x"));
        assert!(has_wildcards("x?"));
    }

    #[test]
    fn distances() {
        assert_eq!(edit_distance("pars", "parse", 3), Some(1));
        assert_eq!(edit_distance("kitten", "sitting", 3), Some(3));
        assert_eq!(edit_distance("kitten", "sitting", 2), None);
        assert_eq!(edit_distance("", "abc", 3), Some(3));
        assert_eq!(edit_distance("abc", "abc", 0), Some(0));
        assert_eq!(edit_distance("mian", "main", 1), Some(1));
        assert_eq!(edit_distance("ab", "ba", 1), Some(1));
    }

    #[test]
    fn suggestions() {
        let names = [
            "parse",
            "parser_free",
            "part",
            "main",
            "Parse",
            "sparse",
            "pars",
        ];
        assert_eq!(suggest("pars", names), vec!["parse", "part"]);
        // Exact name is not suggested; case-insensitive equal comes first.
        assert_eq!(
            suggest("pars", ["pars", "parse", "Pars"]),
            vec!["Pars", "parse"]
        );
        assert_eq!(
            suggest(
                "parse_args",
                ["parse_arg", "parse_argv", "parse_xx", "xparse_args"]
            ),
            vec!["parse_arg", "parse_argv", "xparse_args"]
        );
        assert_eq!(suggest("mian", ["main", "xyz"]), vec!["main"]);
        assert_eq!(
            suggest("completely_else", ["main", "parse"]),
            Vec::<String>::new()
        );
        assert_eq!(
            suggest(
                "malloc",
                ["malloc_usable_size", "calloc", "mallocx", "__libc_malloc"]
            ),
            vec!["calloc", "mallocx"]
        );
    }
}
