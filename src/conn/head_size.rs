//! Where a head ends, for the size check of a head while it arrives ([`super::Tracked`]).
//!
//! Pingora reads a head until it parses whole, and then reads no more of it: so a read that
//! takes the head past `server.max_request_header_bytes` holds its end, if the head ends within
//! the limit, and any later read of the same head is past the limit. Only such a read (at most
//! one per head, and none for a head within the limit) is scanned, and only up to the limit.
//!
//! Phase: connection, while a head arrives (only a read that takes it past the limit).

/// Whether a head that has `room` bytes left within the limit ends in `read`, the bytes just
/// read: an empty line (`\n\n` or `\n\r\n`, as the parser accepts bare `\n` line ends) whose
/// last byte is among the first `room`. A `\n` at the start of `read`, alone or after `\r`,
/// counts too: the line before it may have ended in the previous read (if it did not, the
/// parser wants more, and that read is refused).
pub(super) fn ends_within(read: &[u8], room: usize) -> bool {
    let window = &read[..room.min(read.len())];
    window
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .any(|(i, _)| {
            matches!(
                &window[..i],
                [] | [b'\r'] | [.., b'\n'] | [.., b'\n', b'\r']
            )
        })
}

#[cfg(test)]
mod tests {
    use super::ends_within;

    #[test]
    fn a_head_ends_at_an_empty_line_within_the_room() {
        let head = b"GET / HTTP/1.1\r\nHost: t\r\n\r\nbody";
        let end = head.len() - 4;
        assert!(ends_within(head, end));
        assert!(ends_within(head, 1_000));
        assert!(
            !ends_within(head, end - 1),
            "the end's last byte is past the room"
        );
        assert!(ends_within(b"GET / HTTP/1.1\nHost: t\n\n", 24));
        assert!(!ends_within(
            b"GET / HTTP/1.1\r\nHost: t\r\nX-Pad: aaaa",
            1_000
        ));
        assert!(!ends_within(b"anything\r\n", 0), "no room");
    }

    #[test]
    fn an_end_begun_in_the_previous_read_counts() {
        assert!(ends_within(b"\n", 1), "after \\r\\n\\r");
        assert!(ends_within(b"\r\n", 2), "after \\r\\n");
        assert!(!ends_within(b"x\r\n", 3));
    }
}
