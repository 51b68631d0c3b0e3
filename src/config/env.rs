//! `${NAME}` and `${NAME:-default}` in `gateway.yaml`, expanded from the environment before
//! the text is parsed: at start, by `tollgate check` and on every reload. One file then serves
//! every environment (compose, Kubernetes, the local fleet script), each supplying its own
//! addresses and ports.
//!
//! - `${NAME}` is the variable's value; unset, it is an error naming the variable and its
//!   line. Set but empty, it is empty.
//! - `${NAME:-default}` is the value when set and not empty, else `default` (the text up to
//!   the first `}`).
//! - `$${` is a literal `${`. A `$` not followed by `{` is kept as it is.
//! - Comments are left alone: a `#` at the start of a line or after a space or tab, outside
//!   quotes, ends what is expanded on that line.
//!
//! The value goes into the text as it is, before YAML sees it, so numbers and durations work
//! (`limit: ${FREE_PER_MINUTE:-60}`). But a value must end up as one scalar: one that could
//! add YAML structure where its reference stands is refused, naming the variable, its line
//! and column, and what it holds (never the value, which may be a secret):
//!
//! - anywhere: a line break or any other control character;
//! - inside `"..."`: `"` and `\`; inside `'...'`: `'`;
//! - outside quotes: `"`, `'`, `#`, `,`, `[`, `]`, `{`, `}`, `: `, a `:` at its end, a space
//!   at its start or end, and where the value starts a scalar (after a space, `[`, `{`, `,` or
//!   at the start of a line) `&`, `*`, `!`, `|`, `>`, `%`, `@` or `` ` `` first, or `-`, `?`
//!   or `:` first followed by a space or nothing.
//!
//! So `trusted_proxies: ["${PROXY}"]` cannot be given a second entry, nor
//! `{ limit: ${LIMIT} }` a second key. Quote a reference whose value may hold `:`, `#`,
//! spaces or commas (`url: "${REDIS_URL}"`). Defaults are the file's own text and are not
//! checked.
//!
//! Phase: startup and reload only.

use super::errors::Errors;
use super::ConfigErrors;

/// What every reference must look like, for error messages.
const FORM: &str = "write ${NAME} or ${NAME:-default}, NAME of letters, digits and '_'";

/// Expand every reference in `text` with `lookup` (the environment, in [`super::load`]).
/// Every mistake is reported, each as `file: line L column C: ...`, in file order.
pub fn expand_env(
    file: &str,
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, ConfigErrors> {
    let mut errs = Errors::new(file);
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let (code, comment) = line.split_at(comment_start(line));
        expand_line(code, i + 1, &lookup, &mut out, &mut errs);
        out.push_str(comment);
    }
    errs.finish().map(|()| out)
}

/// Where a reference stands: what YAML makes of the text pasted there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Context {
    /// Outside quotes: a plain scalar (or a key, or a flow collection's entry).
    Plain,
    /// Inside `'...'`.
    Single,
    /// Inside `"..."`.
    Double,
}

/// The quotes of one line, read left to right.
struct Quotes {
    single: bool,
    double: bool,
    prev: char,
}

impl Quotes {
    fn new() -> Quotes {
        Quotes {
            single: false,
            double: false,
            prev: ' ',
        }
    }

    fn context(&self) -> Context {
        match (self.single, self.double) {
            (true, _) => Context::Single,
            (_, true) => Context::Double,
            _ => Context::Plain,
        }
    }

    /// Step over `c` at byte `i` of the line; `true` when a comment starts there.
    fn step(&mut self, i: usize, c: char) -> bool {
        let prev = std::mem::replace(&mut self.prev, c);
        // A quote opens a scalar only where one can start (so `it's` opens nothing).
        let opens = matches!(prev, ' ' | '\t' | '[' | '{' | ',') || i == 0;
        match c {
            '\'' if self.single => self.single = false,
            '\'' if !self.double && opens => self.single = true,
            '"' if self.double && prev != '\\' => self.double = false,
            '"' if !self.single && opens => self.double = true,
            '#' if !self.single && !self.double && (prev == ' ' || prev == '\t' || i == 0) => {
                return true
            }
            _ => {}
        }
        false
    }
}

/// Where the comment of `line` starts (its length when it has none).
fn comment_start(line: &str) -> usize {
    let mut quotes = Quotes::new();
    line.char_indices()
        .find(|&(i, c)| quotes.step(i, c))
        .map_or(line.len(), |(i, _)| i)
}

/// The context at byte `at` of `code` (a line without its comment).
fn context_at(code: &str, at: usize) -> Context {
    let mut quotes = Quotes::new();
    for (i, c) in code[..at].char_indices() {
        quotes.step(i, c);
    }
    quotes.context()
}

/// What in `value`, pasted where `context` says (and at the start of a scalar when `starts`),
/// would make it more than one scalar (end a quote, start a comment, a flow collection, an
/// entry, a key, an anchor, an alias, a tag or a block scalar), in words; `None` when it stays
/// one scalar. The value itself is never repeated: it may be a secret.
fn adds_structure(value: &str, context: Context, starts: bool) -> Option<String> {
    let quote = |c: char| match c {
        '"' => "a double quote".to_string(),
        '\'' => "a single quote".to_string(),
        '\\' => "a backslash".to_string(),
        c => format!("'{c}'"),
    };
    if value
        .chars()
        .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}')
    {
        return Some("a line break or another control character".into());
    }
    let special: &[char] = match context {
        Context::Single => &['\''],
        Context::Double => &['"', '\\'],
        Context::Plain => &['"', '\'', '#', ',', '[', ']', '{', '}'],
    };
    if let Some(c) = value.chars().find(|c| special.contains(c)) {
        return Some(quote(c));
    }
    if context != Context::Plain {
        return None;
    }
    if value.contains(": ") {
        return Some("': '".into());
    }
    if value.ends_with(':') {
        return Some("':' at its end".into());
    }
    if value.starts_with(' ') || value.ends_with(' ') {
        return Some("a space at its start or end".into());
    }
    let mut chars = value.chars();
    let (first, second) = (chars.next(), chars.next());
    match first {
        Some(c @ ('&' | '*' | '!' | '|' | '>' | '%' | '@' | '`')) if starts => {
            Some(format!("'{c}' at its start"))
        }
        Some(c @ ('-' | '?' | ':')) if starts && matches!(second, None | Some(' ')) => {
            Some(format!("'{c}' at its start"))
        }
        _ => None,
    }
}

/// Whether text pasted after `out` starts a scalar: at the start of a line, after a space, or
/// after `[`, `{` or `,`.
fn starts_scalar(out: &str) -> bool {
    matches!(
        out.chars().next_back(),
        None | Some('\n' | ' ' | '\t' | '[' | '{' | ',')
    )
}

fn expand_line(
    code: &str,
    line: usize,
    lookup: &impl Fn(&str) -> Option<String>,
    out: &mut String,
    errs: &mut Errors,
) {
    let mut rest = code;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let column = code.len() - tail.len() + 1;
        let here = |msg: String| format!("line {line} column {column}: {msg}");
        if let Some(after) = tail.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
            continue;
        }
        let Some(inner) = tail.strip_prefix("${") else {
            out.push('$');
            rest = &tail[1..];
            continue;
        };
        let Some(end) = inner.find('}') else {
            let name_len = inner
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(inner.len());
            let shown = &tail[..name_len + 2];
            errs.at("", here(format!("{shown:?} is not closed: {FORM}")));
            return;
        };
        let reference = &tail[..end + 3];
        rest = &inner[end + 1..];
        let (name, default) = match inner[..end].split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (&inner[..end], None),
        };
        if !is_variable_name(name) {
            errs.at(
                "",
                here(format!("{reference:?} is not a variable reference: {FORM}")),
            );
            continue;
        }
        match (lookup(name), default) {
            (Some(v), Some(d)) if v.is_empty() => out.push_str(d),
            (Some(v), _) => {
                let context = context_at(code, column - 1);
                match adds_structure(&v, context, starts_scalar(out)) {
                    None => out.push_str(&v),
                    Some(what) => errs.at("", here(refused(name, &what, context))),
                }
            }
            (None, Some(d)) => out.push_str(d),
            (None, None) => errs.at(
                "",
                here(format!(
                    "environment variable {name} is not set, and {reference} has no default \
                     (write ${{{name}:-default}} to give one)"
                )),
            ),
        }
    }
    out.push_str(rest);
}

/// The error of a value that would add structure.
fn refused(name: &str, what: &str, context: Context) -> String {
    let place = match context {
        Context::Plain => "outside quotes",
        Context::Single => "inside single quotes",
        Context::Double => "inside double quotes",
    };
    let hint = match context {
        Context::Plain => {
            format!(" (quoted, as \"${{{name}}}\", a string may hold spaces and , # : [ ] {{ }})")
        }
        _ => String::new(),
    };
    format!(
        "environment variable {name} holds {what}, which would add YAML structure where \
         ${{{name}}} stands ({place}): a value must stay one scalar{hint}"
    )
}

fn is_variable_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "PORT" => Some("8081".into()),
            "EMPTY" => Some(String::new()),
            "URL" => Some("redis://10.0.0.1:6379/0".into()),
            _ => None,
        }
    }

    fn expand(text: &str) -> Result<String, Vec<String>> {
        expand_env("g.yaml", text, env).map_err(|e| e.0)
    }

    #[test]
    fn set_defaulted_empty_literal_and_commented() {
        for (text, want) in [
            ("a: ${PORT}\n", "a: 8081\n"),
            ("a: ${UNSET:-9000}\n", "a: 9000\n"),
            ("a: ${PORT:-9000}\n", "a: 8081\n"),
            ("a: '${EMPTY}'\n", "a: ''\n"),
            ("a: ${EMPTY:-x}\n", "a: x\n"),
            ("a: ${UNSET:-}\n", "a: \n"),
            ("a: \"127.0.0.1:${PORT}\"", "a: \"127.0.0.1:8081\""),
            (
                "url: \"${URL}\" # ${NOT_EXPANDED}\n",
                "url: \"redis://10.0.0.1:6379/0\" # ${NOT_EXPANDED}\n",
            ),
            // Literals, comments and quotes.
            ("a: $${PORT} $x $\n", "a: ${PORT} $x $\n"),
            ("# ${UNSET}\n", "# ${UNSET}\n"),
            ("a: 'x # ${PORT}'\n", "a: 'x # 8081'\n"),
            ("a: x#${PORT}\n", "a: x#8081\n"),
            ("a: it's # ${UNSET}\n", "a: it's # ${UNSET}\n"),
        ] {
            assert_eq!(expand(text).unwrap(), want, "{text:?}");
        }
    }

    #[test]
    fn every_mistake_with_its_line_and_column() {
        assert_eq!(
            expand("a: 1\nb: ${UNSET}\nc: ${ALSO_UNSET} ${1X} ${}\nd: ${OPEN\n").unwrap_err(),
            vec![
                "g.yaml: line 2 column 4: environment variable UNSET is not set, and ${UNSET} has no default (write ${UNSET:-default} to give one)",
                "g.yaml: line 3 column 4: environment variable ALSO_UNSET is not set, and ${ALSO_UNSET} has no default (write ${ALSO_UNSET:-default} to give one)",
                "g.yaml: line 3 column 18: \"${1X}\" is not a variable reference: write ${NAME} or ${NAME:-default}, NAME of letters, digits and '_'",
                "g.yaml: line 3 column 24: \"${}\" is not a variable reference: write ${NAME} or ${NAME:-default}, NAME of letters, digits and '_'",
                "g.yaml: line 4 column 4: \"${OPEN\" is not closed: write ${NAME} or ${NAME:-default}, NAME of letters, digits and '_'",
            ]
        );
    }

    fn expand_with(text: &str, value: &str) -> Result<String, Vec<String>> {
        expand_env("g.yaml", text, |n| (n == "V").then(|| value.to_string())).map_err(|e| e.0)
    }

    #[test]
    fn a_value_that_would_add_structure_is_refused_naming_the_variable() {
        let plain = "a: { limit: ${V}, window: 1m }\n";
        let double = "p: [\"127.0.0.1/32\", \"${V}\"]\n";
        let single = "p: '${V}'\n";
        let item = "p:\n  - ${V}\n";
        for (text, value, what) in [
            (plain, "100, shadow: true", "','"),
            (
                plain,
                "100\nshadow: true",
                "a line break or another control character",
            ),
            (plain, "100\r", "a line break or another control character"),
            (
                plain,
                "100\u{2028}",
                "a line break or another control character",
            ),
            (plain, "100 # x", "'#'"),
            (plain, "x\"y", "a double quote"),
            (plain, "x'y", "a single quote"),
            (plain, "[1]", "'['"),
            (plain, "1]", "']'"),
            (plain, "{a", "'{'"),
            (plain, "a}", "'}'"),
            (plain, "a: b", "': '"),
            (plain, "a:", "':' at its end"),
            (plain, " 100", "a space at its start or end"),
            (plain, "100 ", "a space at its start or end"),
            (plain, "&anchor", "'&' at its start"),
            (plain, "*alias", "'*' at its start"),
            (plain, "!!str 5", "'!' at its start"),
            (plain, "|", "'|' at its start"),
            (plain, ">", "'>' at its start"),
            (plain, "%x", "'%' at its start"),
            (plain, "@x", "'@' at its start"),
            (plain, "`x", "'`' at its start"),
            (item, "- 0.0.0.0/0", "'-' at its start"),
            (item, "-", "'-' at its start"),
            (item, "? k", "'?' at its start"),
            (double, "10.0.0.1/32\", \"0.0.0.0/0", "a double quote"),
            (double, "x\\", "a backslash"),
            (double, "a\nb", "a line break or another control character"),
            (single, "x', 'y", "a single quote"),
        ] {
            let place = match text {
                t if t == double => "inside double quotes",
                t if t == single => "inside single quotes",
                _ => "outside quotes",
            };
            let err = expand_with(text, value).expect_err(value);
            assert_eq!(err.len(), 1, "{err:?}");
            let want = format!(
                "environment variable V holds {what}, which would add YAML structure where ${{V}} stands ({place}): a value must stay one scalar"
            );
            assert!(err[0].contains(&want), "{value:?}: {}\nwant {want}", err[0]);
            assert!(err[0].starts_with("g.yaml: line "), "{}", err[0]);
        }
    }

    #[test]
    fn values_that_stay_one_scalar_are_pasted() {
        for (text, value, want) in [
            // Inside double quotes: anything but `"`, `\` and control characters.
            (
                "u: \"${V}\"\n",
                "redis://:p@ss#w,rd: [x]{y}&*!|>%@`'@h:1/0",
                None,
            ),
            ("u: '${V}'\n", "a \"b\" # c, d: [e]", None),
            // Outside quotes: mid-scalar indicators are text; so are `-5` and `a:b`.
            ("a: ${V}\n", "-5", None),
            ("a: ${V}\n", "a:b", None),
            ("a: x${V}\n", "&*!|>%@`", None),
            ("a: ${V}\n", "a b-c", None),
            ("a: redis://${V}:6379\n", "h", Some("a: redis://h:6379\n")),
            ("a: ${V}\n", "", Some("a: \n")),
        ] {
            let got = expand_with(text, value).unwrap_or_else(|e| panic!("{value:?}: {e:?}"));
            let want = want.map_or_else(|| text.replace("${V}", value), str::to_string);
            assert_eq!(got, want);
        }
    }
}
