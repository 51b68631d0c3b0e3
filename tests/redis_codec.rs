//! The patched `redis` crate's wire format (`patches/README.md`).
//!
//! - Pull request 1, the reply decoder: a complete bulk string is read without the parser
//!   combinator, and every other reply as before. Checked against the crate's own synchronous
//!   parser, which is the combinator alone: the same values in the same order, whatever the
//!   type of reply and wherever the bytes are split between reads, and an error where the
//!   combinator finds one.
//! - Pull request 2, the command encoder: counts and lengths below 100 are written without
//!   formatting them. Checked against RESP written out by hand, at every count and length the
//!   change treats apart.

use std::io::Cursor;

use bytes::BytesMut;
use proptest::prelude::*;
use redis::{Cmd, Parser, Value, ValueCodec};
use tokio_util::codec::Decoder;

/// Replies of every type, bulk strings at and around the fast path's edges among them.
const REPLIES: &[&[u8]] = &[
    b"$5\r\nhello\r\n",
    b"$0\r\n\r\n",
    b"$28\r\n1 99 60000 0 1 1764032400123\r\n",
    b"$4\r\na\r\nb\r\n",
    b"$005\r\nhello\r\n",
    b"$+5\r\nhello\r\n",
    b"$ 5\r\nhello\r\n",
    b"$-1\r\n",
    b"+OK\r\n",
    b"+PONG\r\n",
    b"-ERR wrong\r\n",
    b"-NOSCRIPT No matching script\r\n",
    b":42\r\n",
    b":-7\r\n",
    b"*2\r\n$1\r\na\r\n:1\r\n",
    b"*-1\r\n",
    b"*0\r\n",
    b"%1\r\n$1\r\nk\r\n$1\r\nv\r\n",
    b"~1\r\n:1\r\n",
    b",3.5\r\n",
    b"#t\r\n",
    b"_\r\n",
    b"=7\r\ntxt:abc\r\n",
    b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n",
    b"(12345678901234567890\r\n",
];

/// The first `n` values the combinator alone reads from `bytes`, in order.
fn reference(bytes: &[u8], n: usize) -> Vec<Value> {
    let mut reader = Cursor::new(bytes);
    let mut parser = Parser::new();
    (0..n)
        .map(|_| parser.parse_value(&mut reader).expect("a valid reply"))
        .collect()
}

/// Every value the codec reads when `bytes` arrive in the pieces `cuts` makes (offsets in
/// increasing order), decoding after each piece as a connection does.
fn decoded(bytes: &[u8], cuts: &[usize]) -> Result<Vec<Value>, redis::RedisError> {
    let mut codec = ValueCodec::default();
    let mut buf = BytesMut::new();
    let mut out = vec![];
    let mut from = 0;
    for &to in cuts.iter().chain([bytes.len()].iter()) {
        buf.extend_from_slice(&bytes[from..to]);
        from = to;
        while let Some(v) = codec.decode(&mut buf)? {
            out.push(v);
        }
    }
    assert!(buf.is_empty(), "{} bytes left undecoded", buf.len());
    Ok(out)
}

#[test]
fn each_reply_reads_as_the_combinator_reads_it_whole_and_split_anywhere() {
    for reply in REPLIES {
        let expected = reference(reply, 1);
        assert_eq!(decoded(reply, &[]).unwrap(), expected, "{reply:?} whole");
        for cut in 1..reply.len() {
            assert_eq!(
                decoded(reply, &[cut]).unwrap(),
                expected,
                "{reply:?} split at {cut}"
            );
        }
        let every_byte: Vec<usize> = (1..reply.len()).collect();
        assert_eq!(
            decoded(reply, &every_byte).unwrap(),
            expected,
            "{reply:?} a byte at a time"
        );
    }
}

#[test]
fn a_reply_after_one_the_combinator_read_in_part_is_read_from_its_start() {
    // The first reply arrives in two reads, so the combinator holds its place in between; the
    // bulk string after it must not be taken by the fast path from the middle of the first.
    for first in REPLIES {
        for second in [&b"$3\r\nabc\r\n"[..], b"$5\r\n$3\r\nx\r\n"] {
            let both = [*first, second].concat();
            let expected = reference(&both, 2);
            for cut in 1..first.len() {
                assert_eq!(
                    decoded(&both, &[cut]).unwrap(),
                    expected,
                    "{both:?} split at {cut}"
                );
            }
        }
    }
}

#[test]
fn a_bulk_string_without_its_final_crlf_is_an_error_as_before() {
    for bad in [&b"$3\r\nabcXY"[..], b"$3\r\nabc\rX", b"$3\r\nabc\n\r"] {
        assert!(decoded(bad, &[]).is_err(), "{bad:?}");
        assert!(Parser::new().parse_value(Cursor::new(bad)).is_err());
    }
}

#[test]
fn nothing_is_read_from_an_empty_buffer_or_an_incomplete_reply() {
    let mut codec = ValueCodec::default();
    let mut buf = BytesMut::new();
    assert_eq!(codec.decode(&mut buf).unwrap(), None);
    buf.extend_from_slice(b"$5\r\nhel");
    assert_eq!(codec.decode(&mut buf).unwrap(), None);
    buf.extend_from_slice(b"lo\r\n:1\r\n");
    assert_eq!(
        codec.decode(&mut buf).unwrap(),
        Some(Value::BulkString(b"hello".to_vec()))
    );
    assert_eq!(codec.decode(&mut buf).unwrap(), Some(Value::Int(1)));
    assert_eq!(codec.decode(&mut buf).unwrap(), None);
    assert!(buf.is_empty());
}

/// A stream of replies: bulk strings of any bytes (CRLF inside them too), integers, simple
/// strings, nils and arrays of bulk strings.
fn reply() -> impl Strategy<Value = Vec<u8>> {
    let bulk = proptest::collection::vec(any::<u8>(), 0..40).prop_map(|d| {
        [
            format!("${}\r\n", d.len()).into_bytes(),
            d,
            b"\r\n".to_vec(),
        ]
        .concat()
    });
    prop_oneof![
        4 => bulk.clone(),
        1 => any::<i64>().prop_map(|n| format!(":{n}\r\n").into_bytes()),
        1 => "[a-zA-Z ]{0,12}".prop_map(|s| format!("+{s}\r\n").into_bytes()),
        1 => Just(b"$-1\r\n".to_vec()),
        1 => proptest::collection::vec(bulk, 0..4).prop_map(|items| {
            [format!("*{}\r\n", items.len()).into_bytes(), items.concat()].concat()
        }),
    ]
}

proptest! {
    #[test]
    fn any_stream_of_replies_in_any_pieces_reads_as_the_combinator_reads_it(
        replies in proptest::collection::vec(reply(), 1..6),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let bytes = replies.concat();
        let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len())).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let expected = reference(&bytes, replies.len());
        prop_assert_eq!(decoded(&bytes, &cuts).unwrap(), expected);
    }
}

/// A command as RESP, written out by hand: `*<count>`, then `$<length>` and the bytes of each
/// argument, each line ended by CRLF.
fn resp(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn command(args: &[Vec<u8>]) -> Cmd {
    let mut cmd = Cmd::new();
    for a in args {
        cmd.arg(&a[..]);
    }
    cmd
}

#[test]
fn a_command_is_packed_as_resp_at_every_count_and_length_written_apart() {
    // One, two and three digits, at each edge, for the count of arguments and for a length.
    let edges = [0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 12345];
    for &count in edges.iter().filter(|&&c| (1..=1000).contains(&c)) {
        let args: Vec<Vec<u8>> = (0..count).map(|i| vec![b'a' + (i % 26) as u8]).collect();
        assert_eq!(
            command(&args).get_packed_command(),
            resp(&args),
            "{count} arguments"
        );
    }
    for &len in &edges {
        let args = vec![b"SET".to_vec(), b"k".to_vec(), vec![b'\r'; len]];
        assert_eq!(
            command(&args).get_packed_command(),
            resp(&args),
            "length {len}"
        );
    }
    // A pipeline packs each command the same way, one after the other.
    let (a, b) = (
        vec![b"GET".to_vec(), vec![b'x'; 100]],
        vec![b"PING".to_vec()],
    );
    let mut pipe = redis::pipe();
    pipe.add_command(command(&a)).add_command(command(&b));
    assert_eq!(pipe.get_packed_pipeline(), [resp(&a), resp(&b)].concat());
}

proptest! {
    #[test]
    fn any_command_is_packed_as_resp(
        args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..130), 1..130),
    ) {
        prop_assert_eq!(command(&args).get_packed_command(), resp(&args));
    }
}
