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
//! (`limit: ${FREE_PER_MINUTE:-60}`). Quote a reference whose value may hold `:` or `#`
//! (`url: "${REDIS_URL}"`).
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

/// Where the comment of `line` starts (its length when it has none).
fn comment_start(line: &str) -> usize {
    let (mut single, mut double, mut prev) = (false, false, ' ');
    for (i, c) in line.char_indices() {
        // A quote opens a scalar only where one can start (so `it's` opens nothing).
        let opens = matches!(prev, ' ' | '\t' | '[' | '{' | ',') || i == 0;
        match c {
            '\'' if single => single = false,
            '\'' if !double && opens => single = true,
            '"' if double && prev != '\\' => double = false,
            '"' if !single && opens => double = true,
            '#' if !single && !double && (prev == ' ' || prev == '\t' || i == 0) => return i,
            _ => {}
        }
        prev = c;
    }
    line.len()
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
            (Some(v), _) => out.push_str(&v),
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
}
