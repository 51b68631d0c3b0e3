//! Writing access-log fields as JSON or logfmt straight into a byte buffer, without the `fmt`
//! machinery: numbers, IPv4 addresses, hex ids and the time are written by hand, keys and
//! values known to be safe (names from the config, fixed words) are copied as they are, and
//! only client-chosen strings are escaped. A line costs a few hundred instructions this way,
//! against about ten thousand through `serde_json` and `Display`.
//!
//! Phase: the end of a request, only while the access log is on.

use std::cell::Cell;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::AccessLogFormat;

/// A field's name, written out for either format: `,"name":` for JSON and ` name=` for text
/// (the first field of a line drops the separator), so a key costs one copy. Made by [`key!`].
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub json: &'static str,
    pub text: &'static str,
}

/// The [`Key`] of the field named by a string literal.
macro_rules! key {
    ($name:literal) => {
        $crate::observe::format::Key {
            json: concat!(",\"", $name, "\":"),
            text: concat!(" ", $name, "="),
        }
    };
}
pub(crate) use key;

/// One field's value.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    /// Absent: `null` in JSON, `-` in text.
    None,
    /// A string that may hold anything: escaped (JSON) or quoted when needed (text).
    Str(&'a str),
    /// `prefix` and an arbitrary string, as one value (`user:<claim>`).
    Tagged(&'static str, &'a str),
    /// A string known to need no escaping or quotes (config names, fixed words, hex).
    Safe(&'a str),
    Num(u64),
    /// Microseconds, written as milliseconds with three decimals.
    Micros(u64),
    Ip(IpAddr),
    Addr(SocketAddr),
    /// RFC 3339, UTC, milliseconds.
    Time(SystemTime),
    /// `<16 hex digits>-<hex>`: a request id made by the gateway, as its [`id_prefix`] (the
    /// process's) and its number.
    MadeId(&'a [u8; 17], u64),
}

/// Write `fields` as one line in `format`, with its newline.
pub fn line(out: &mut Vec<u8>, format: AccessLogFormat, fields: &[(Key, Value<'_>)]) {
    match format {
        AccessLogFormat::Json => {
            out.push(b'{');
            for (i, (key, v)) in fields.iter().enumerate() {
                out.extend_from_slice(&key.json.as_bytes()[usize::from(i == 0)..]);
                json(out, v);
            }
            out.extend_from_slice(b"}\n");
        }
        AccessLogFormat::Text => {
            for (i, (key, v)) in fields.iter().enumerate() {
                out.extend_from_slice(&key.text.as_bytes()[usize::from(i == 0)..]);
                text(out, v);
            }
            out.push(b'\n');
        }
    }
}

/// The first part of every request id this process makes: `instance` in 16 hex digits, `-`.
pub fn id_prefix(instance: u64) -> [u8; 17] {
    let mut prefix = [b'-'; 17];
    let mut hex = Vec::with_capacity(16);
    push_hex(&mut hex, instance, 16);
    prefix[..16].copy_from_slice(&hex);
    prefix
}

fn json(o: &mut Vec<u8>, v: &Value<'_>) {
    match *v {
        Value::None => o.extend_from_slice(b"null"),
        Value::Num(n) => push_u64(o, n),
        Value::Micros(us) => push_micros(o, us),
        Value::Str(s) => {
            o.push(b'"');
            escape_json(o, s);
            o.push(b'"');
        }
        Value::Tagged(prefix, s) => {
            o.push(b'"');
            o.extend_from_slice(prefix.as_bytes());
            escape_json(o, s);
            o.push(b'"');
        }
        _ => {
            o.push(b'"');
            plain_value(o, v);
            o.push(b'"');
        }
    }
}

fn text(o: &mut Vec<u8>, v: &Value<'_>) {
    match *v {
        Value::None => o.push(b'-'),
        Value::Str(s) => quoted(o, "", s),
        Value::Tagged(prefix, s) => quoted(o, prefix, s),
        Value::Num(n) => push_u64(o, n),
        Value::Micros(us) => push_micros(o, us),
        _ => plain_value(o, v),
    }
}

/// A value that needs neither escaping nor quotes.
fn plain_value(o: &mut Vec<u8>, v: &Value<'_>) {
    match *v {
        Value::Safe(s) => o.extend_from_slice(s.as_bytes()),
        Value::Ip(ip) => push_ip(o, ip),
        Value::Addr(SocketAddr::V4(a)) => {
            push_ip(o, IpAddr::V4(*a.ip()));
            o.push(b':');
            push_u64(o, u64::from(a.port()));
        }
        Value::Addr(a) => {
            let _ = write!(o, "{a}");
        }
        Value::Time(t) => push_time(o, t),
        Value::MadeId(prefix, n) => {
            o.extend_from_slice(prefix);
            push_hex(o, n, 1);
        }
        Value::None | Value::Str(_) | Value::Tagged(..) | Value::Num(_) | Value::Micros(_) => {
            unreachable!("not a plain value: {v:?}")
        }
    }
}

/// JSON string contents: `"`, `\` and control characters escaped; the rest as it is.
fn escape_json(o: &mut Vec<u8>, s: &str) {
    let needs = |c: u8| c < 0x20 || c == b'"' || c == b'\\';
    if !s.bytes().any(needs) {
        o.extend_from_slice(s.as_bytes());
        return;
    }
    for c in s.bytes() {
        match c {
            b'"' => o.extend_from_slice(b"\\\""),
            b'\\' => o.extend_from_slice(b"\\\\"),
            c if c < 0x20 => {
                o.extend_from_slice(b"\\u00");
                push_hex(o, u64::from(c), 2);
            }
            c => o.push(c),
        }
    }
}

/// logfmt: `prefix` + `v`, in double quotes with `"` and `\` escaped when it has a space, a
/// quote, `=` or a control character (written as `?`), or is empty.
fn quoted(o: &mut Vec<u8>, prefix: &str, v: &str) {
    let plain = !v.is_empty()
        && v.bytes()
            .all(|c| c.is_ascii_graphic() && c != b'"' && c != b'=' && c != b'\\');
    if plain {
        o.extend_from_slice(prefix.as_bytes());
        o.extend_from_slice(v.as_bytes());
        return;
    }
    o.push(b'"');
    o.extend_from_slice(prefix.as_bytes());
    let mut buf = [0u8; 4];
    for c in v.chars() {
        match c {
            '"' | '\\' => o.extend_from_slice(&[b'\\', c as u8]),
            c if c.is_control() => o.push(b'?'),
            c => o.extend_from_slice(c.encode_utf8(&mut buf).as_bytes()),
        }
    }
    o.push(b'"');
}

pub fn push_u64(o: &mut Vec<u8>, n: u64) {
    o.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `n` in lowercase hex, at least `width` digits.
pub fn push_hex(o: &mut Vec<u8>, n: u64, width: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = (16 - n.leading_zeros() as usize / 4)
        .max(width)
        .clamp(1, 16);
    let mut buf = [0u8; 16];
    for (i, b) in buf[..digits].iter_mut().enumerate() {
        *b = HEX[((n >> (4 * (digits - 1 - i))) & 0xf) as usize];
    }
    o.extend_from_slice(&buf[..digits]);
}

fn push_micros(o: &mut Vec<u8>, us: u64) {
    push_u64(o, us / 1000);
    let frac = us % 1000;
    o.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

/// Append `ip` in its usual text form (IPv4 without `fmt`: a third of the cost).
pub fn push_ip(o: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            // Into a buffer first: one copy into the line, not one per octet.
            let (mut buf, mut len) = ([0u8; 15], 0);
            let mut put = |c: u8| {
                buf[len] = c;
                len += 1;
            };
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    put(b'.');
                }
                if octet >= 100 {
                    put(b'0' + octet / 100);
                }
                if octet >= 10 {
                    put(b'0' + octet / 10 % 10);
                }
                put(b'0' + octet % 10);
            }
            o.extend_from_slice(&buf[..len]);
        }
        IpAddr::V6(v6) => {
            let _ = write!(o, "{v6}");
        }
    }
}

thread_local! {
    /// The last second this thread wrote, and its `YYYY-MM-DDTHH:MM:SS`.
    static SECOND: Cell<(u64, [u8; 19])> = const { Cell::new((u64::MAX, [0; 19])) };
}

/// RFC 3339 with milliseconds: the date and time of a second are computed once per second
/// and thread.
fn push_time(o: &mut Vec<u8>, t: SystemTime) {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (secs, millis) = (since.as_secs(), u64::from(since.subsec_millis()));
    let (cached, mut text) = SECOND.get();
    if cached != secs {
        let full =
            humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_secs(secs));
        let full = full.to_string();
        text.copy_from_slice(&full.as_bytes()[..19]);
        SECOND.set((secs, text));
    }
    o.extend_from_slice(&text);
    o.extend_from_slice(&[
        b'.',
        b'0' + (millis / 100) as u8,
        b'0' + (millis / 10 % 10) as u8,
        b'0' + (millis % 10) as u8,
        b'Z',
    ]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(fields: &[(Key, Value<'_>)]) -> (String, String) {
        let (mut j, mut t) = (Vec::new(), Vec::new());
        line(&mut j, AccessLogFormat::Json, fields);
        line(&mut t, AccessLogFormat::Text, fields);
        (String::from_utf8(j).unwrap(), String::from_utf8(t).unwrap())
    }

    #[test]
    fn json_and_text_of_every_kind_of_value() {
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1_795_470_237_148);
        let prefix = id_prefix(0xa5d4_48fd_0359_e0a2);
        let (json, text) = both(&[
            (key!("time"), Value::Time(t)),
            (key!("id"), Value::MadeId(&prefix, 0xf)),
            (key!("ip"), Value::Ip("10.0.0.255".parse().unwrap())),
            (key!("v6"), Value::Ip("2001:db8::1".parse().unwrap())),
            (key!("up"), Value::Addr("127.0.0.1:9000".parse().unwrap())),
            (key!("ua"), Value::Str("a \"b\"\u{1}")),
            (key!("caller"), Value::Tagged("user:", "al ice")),
            (key!("route"), Value::Safe("default")),
            (key!("status"), Value::Num(200)),
            (key!("ms"), Value::Micros(1_005)),
            (key!("limit"), Value::None),
        ]);
        let v: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
        assert_eq!(v["time"], "2026-11-23T21:43:57.148Z");
        assert_eq!(v["id"], "a5d448fd0359e0a2-f");
        assert_eq!(
            (&v["ip"], &v["v6"], &v["up"]),
            (
                &"10.0.0.255".into(),
                &"2001:db8::1".into(),
                &"127.0.0.1:9000".into()
            )
        );
        assert_eq!(
            (&v["ua"], &v["caller"]),
            (&"a \"b\"\u{1}".into(), &"user:al ice".into())
        );
        assert_eq!(
            (&v["status"], &v["ms"], &v["limit"]),
            (&200.into(), &1.005.into(), &serde_json::Value::Null)
        );
        assert_eq!(
            text,
            "time=2026-11-23T21:43:57.148Z id=a5d448fd0359e0a2-f ip=10.0.0.255 v6=2001:db8::1 up=127.0.0.1:9000 ua=\"a \\\"b\\\"?\" caller=\"user:al ice\" route=default status=200 ms=1.005 limit=-\n"
        );
    }

    #[test]
    fn ipv4_octets_of_every_width_and_hex_of_every_length() {
        for ip in ["0.0.0.0", "100.9.10.255", "255.255.255.255", "1.20.199.7"] {
            let mut o = Vec::new();
            push_ip(&mut o, ip.parse().unwrap());
            assert_eq!(o, ip.as_bytes());
        }
        for (n, width, hex) in [
            (0, 1, "0"),
            (0xf, 2, "0f"),
            (u64::MAX, 1, "ffffffffffffffff"),
        ] {
            let mut o = Vec::new();
            push_hex(&mut o, n, width);
            assert_eq!(o, hex.as_bytes());
        }
        assert_eq!(&id_prefix(1), b"0000000000000001-");
    }
}
