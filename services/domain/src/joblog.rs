//! Job logs as the control plane keeps them: each attempt's combined stdout/stderr, shipped
//! by its node in chunks while it runs, of which the first [`HEAD_BYTES`] and the last
//! [`TAIL_BYTES`] are kept. Offsets are byte positions in the attempt's log on its node, so a
//! reader can resume where it stopped and see exactly what was not kept: the output between
//! the head and the tail, said in the log where it is missing, to the byte.

use std::ops::Range;

use crate::format_bytes;

/// How much of the start of each attempt's log the control plane keeps (where a job says
/// what it is and how it was configured, and where it fails when it fails to start).
pub const HEAD_BYTES: u64 = 1024 * 1024;

/// How much of the end of each attempt's log the control plane keeps.
pub const TAIL_BYTES: u64 = 4 * 1024 * 1024;

/// The largest chunk a node may send.
pub const CHUNK_MAX_BYTES: u64 = 256 * 1024;

/// Where the kept tail of a log `len` bytes long starts: never inside the head.
pub fn tail_start(len: u64) -> u64 {
    len.saturating_sub(TAIL_BYTES).max(HEAD_BYTES)
}

/// The part of a log to ship next, given what was shipped (`shipped`, the offset after it),
/// how long the log is now and how much may go in one round: `None` when nothing is new.
/// The head is shipped first; output the control plane would not keep anyway (between the
/// head and the last [`TAIL_BYTES`]) is skipped, so a node that falls behind a fast writer
/// catches up instead of shipping what is dropped on arrival.
pub fn next_range(shipped: u64, len: u64, budget: u64) -> Option<Range<u64>> {
    if len <= shipped || budget == 0 {
        return None;
    }
    let tail = tail_start(len);
    let from = if shipped < HEAD_BYTES {
        shipped
    } else {
        shipped.max(tail)
    };
    let mut to = len.min(from.saturating_add(budget));
    if from < HEAD_BYTES && tail > HEAD_BYTES {
        // The rest of the head, not the output after it that will not be kept.
        to = to.min(HEAD_BYTES);
    }
    Some(from..to)
}

/// `range` in chunks of at most [`CHUNK_MAX_BYTES`].
pub fn chunks(range: Range<u64>) -> impl Iterator<Item = Range<u64>> {
    let end = range.end;
    (range.start..end)
        .step_by(usize::try_from(CHUNK_MAX_BYTES).unwrap_or(usize::MAX))
        .map(move |s| s..end.min(s + CHUNK_MAX_BYTES))
}

/// What of a chunk arriving at `offset` with `len` bytes is new, given that the attempt's
/// kept log ends at `end` (nodes ship an attempt's output in order, so anything before the
/// end was kept or dropped already): the offset and how many leading bytes to skip, or
/// `None` when all of it is old (a chunk sent again after a reconnect or an agent restart).
pub fn new_part(offset: u64, len: u64, end: u64) -> Option<(u64, u64)> {
    let chunk_end = offset.saturating_add(len);
    if chunk_end <= end {
        return None;
    }
    let from = offset.max(end);
    Some((from, from - offset))
}

/// Whether a stored chunk at `offset` is dropped once the attempt's log reaches `end`: it
/// lies past the head and wholly before the kept tail.
pub fn dropped(offset: u64, chunk_len: u64, end: u64) -> bool {
    offset >= HEAD_BYTES && offset.saturating_add(chunk_len) <= end.saturating_sub(TAIL_BYTES)
}

/// One stored chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    pub offset: u64,
    pub data: Vec<u8>,
    /// When the control plane received it (within about half a second of when the job
    /// wrote it); `None` for chunks kept before this was recorded.
    pub received_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl LogChunk {
    pub fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

/// Where the whole log of an attempt is, for a reader told that part of it was not kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOrigin<'a> {
    pub job_id: &'a str,
    pub attempt: u32,
    /// The node's name, once placed.
    pub node: Option<&'a str>,
}

impl LogOrigin<'_> {
    /// The note put where `bytes` of output are missing.
    pub fn gap_note(&self, bytes: u64) -> String {
        let where_ = match self.node {
            Some(node) => format!(
                "node {node} keeps more of it, in its agent's data directory at logs/{}.{}.log",
                self.job_id, self.attempt
            ),
            None => "the node that ran it keeps more of it".to_owned(),
        };
        format!(
            "\n[allot: {bytes} bytes ({}) of output not kept here: the control plane keeps the \
             first {} and the last {} of each attempt; {where_}]\n",
            format_bytes(bytes),
            format_bytes(HEAD_BYTES),
            format_bytes(TAIL_BYTES)
        )
    }
}

/// What a reader at `cursor` gets from `chunks` (ordered by offset, as stored): the bytes
/// from `cursor` on, with a note where output is missing, and the cursor after them.
/// Overlapping chunks (a chunk sent twice) give their bytes once.
pub fn read_from(chunks: &[LogChunk], cursor: u64, origin: &LogOrigin<'_>) -> (Vec<u8>, u64) {
    let (pieces, end) = pieces_from(chunks, cursor, origin);
    (pieces.into_iter().flat_map(|p| p.bytes).collect(), end)
}

/// As [`read_from`], with each line that starts in what is read prefixed by when the control
/// plane received it (RFC 3339, UTC, to the millisecond, then a space; as `kubectl logs
/// --timestamps` does), and a note where output is missing stamped as the output after it.
/// `line_start` says whether the cursor is at the start of a line (a reader starting at a
/// chunk takes it as one), and is left saying whether the end is.
pub fn read_stamped_from(
    chunks: &[LogChunk],
    cursor: u64,
    origin: &LogOrigin<'_>,
    line_start: &mut bool,
) -> (Vec<u8>, u64) {
    let (pieces, end) = pieces_from(chunks, cursor, origin);
    let mut out = Vec::new();
    for p in pieces {
        let stamp =
            p.at.map(|t| format!("{} ", t.format("%Y-%m-%dT%H:%M:%S%.3fZ")));
        for &b in &p.bytes {
            if *line_start && let Some(s) = &stamp {
                out.extend_from_slice(s.as_bytes());
            }
            out.push(b);
            *line_start = b == b'\n';
        }
    }
    (out, end)
}

/// A run of bytes a reader gets, and when the control plane received them.
struct Piece {
    bytes: Vec<u8>,
    at: Option<chrono::DateTime<chrono::Utc>>,
}

fn pieces_from(chunks: &[LogChunk], cursor: u64, origin: &LogOrigin<'_>) -> (Vec<Piece>, u64) {
    let mut out = Vec::new();
    let mut at = cursor;
    for c in chunks {
        if c.end() <= at {
            continue;
        }
        if c.offset > at {
            out.push(Piece {
                bytes: origin.gap_note(c.offset - at).into_bytes(),
                at: c.received_at,
            });
            at = c.offset;
        }
        let skip = usize::try_from(at - c.offset).unwrap_or(usize::MAX);
        out.push(Piece {
            bytes: c.data.get(skip..).unwrap_or_default().to_vec(),
            at: c.received_at,
        });
        at = c.end();
    }
    (out, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(offset: u64, s: &str) -> LogChunk {
        LogChunk {
            offset,
            data: s.as_bytes().to_vec(),
            received_at: None,
        }
    }

    const ORIGIN: LogOrigin<'static> = LogOrigin {
        job_id: "j1",
        attempt: 2,
        node: Some("gpu-3"),
    };

    #[test]
    fn shipping_takes_what_is_new_within_the_budget() {
        assert_eq!(next_range(0, 0, 100), None);
        assert_eq!(next_range(10, 10, 100), None);
        assert_eq!(next_range(0, 10, 0), None);
        assert_eq!(next_range(0, 10, 100), Some(0..10));
        assert_eq!(next_range(4, 10, 3), Some(4..7));
    }

    #[test]
    fn shipping_sends_the_head_then_skips_to_the_tail() {
        let len = HEAD_BYTES + TAIL_BYTES * 3;
        // The head first, a round at a time, never past it.
        assert_eq!(
            next_range(0, len, CHUNK_MAX_BYTES),
            Some(0..CHUNK_MAX_BYTES)
        );
        assert_eq!(
            next_range(HEAD_BYTES - 10, len, CHUNK_MAX_BYTES),
            Some(HEAD_BYTES - 10..HEAD_BYTES)
        );
        // Then what the control plane keeps of the end.
        assert_eq!(
            next_range(HEAD_BYTES, len, CHUNK_MAX_BYTES),
            Some(len - TAIL_BYTES..len - TAIL_BYTES + CHUNK_MAX_BYTES)
        );
        // A log that never outgrows head and tail together is shipped whole.
        let short = HEAD_BYTES + TAIL_BYTES;
        assert_eq!(next_range(0, short, short), Some(0..short));
        assert_eq!(
            next_range(HEAD_BYTES - 1, short, 2),
            Some(HEAD_BYTES - 1..HEAD_BYTES + 1)
        );
    }

    #[test]
    fn a_chunk_sent_again_keeps_only_what_is_new() {
        assert_eq!(new_part(0, 10, 0), Some((0, 0)));
        assert_eq!(new_part(0, 10, 10), None);
        assert_eq!(new_part(0, 10, 4), Some((4, 4)));
        assert_eq!(new_part(20, 10, 4), Some((20, 0)));
    }

    #[test]
    fn the_middle_is_dropped_and_the_head_and_tail_kept() {
        let end = HEAD_BYTES + 2 * TAIL_BYTES;
        assert!(!dropped(0, CHUNK_MAX_BYTES, end), "the head");
        assert!(
            !dropped(HEAD_BYTES - 1, 2, end),
            "a chunk across the head's end"
        );
        assert!(dropped(HEAD_BYTES, CHUNK_MAX_BYTES, end), "the middle");
        assert!(
            !dropped(end - TAIL_BYTES - 1, 2, end),
            "a chunk into the tail"
        );
        assert!(!dropped(end - 5, 5, end), "the tail");
    }

    #[test]
    fn ranges_are_cut_into_chunks_no_larger_than_allowed() {
        let parts: Vec<_> = chunks(5..5 + 2 * CHUNK_MAX_BYTES + 1).collect();
        assert_eq!(
            parts,
            vec![
                5..5 + CHUNK_MAX_BYTES,
                5 + CHUNK_MAX_BYTES..5 + 2 * CHUNK_MAX_BYTES,
                5 + 2 * CHUNK_MAX_BYTES..6 + 2 * CHUNK_MAX_BYTES,
            ]
        );
        assert_eq!(chunks(3..3).count(), 0);
    }

    #[test]
    fn a_reader_resumes_inside_a_chunk() {
        let cs = [chunk(0, "hello "), chunk(6, "world\n")];
        assert_eq!(read_from(&cs, 0, &ORIGIN), (b"hello world\n".to_vec(), 12));
        assert_eq!(read_from(&cs, 3, &ORIGIN), (b"lo world\n".to_vec(), 12));
        assert_eq!(read_from(&cs, 12, &ORIGIN), (Vec::new(), 12));
    }

    #[test]
    fn missing_output_is_said_and_where_to_find_it() {
        let cs = [chunk(5000, "tail\n")];
        let (out, end) = read_from(&cs, 0, &ORIGIN);
        let text = String::from_utf8(out).expect("UTF-8");
        assert_eq!(end, 5005);
        assert!(
            text.contains("5000 bytes (4.9 KiB) of output not kept here"),
            "{text}"
        );
        assert!(text.contains("node gpu-3"), "{text}");
        assert!(text.contains("logs/j1.2.log"), "{text}");
        assert!(text.ends_with("]\ntail\n"), "{text}");
    }

    #[test]
    fn a_chunk_sent_twice_is_read_once() {
        let cs = [chunk(0, "abc"), chunk(0, "abc"), chunk(2, "cde")];
        assert_eq!(read_from(&cs, 0, &ORIGIN), (b"abcde".to_vec(), 5));
    }

    #[test]
    fn each_line_is_stamped_with_when_it_arrived() {
        use chrono::TimeZone;
        let t = |s: i64| {
            chrono::Utc
                .timestamp_millis_opt(1_765_000_000_000 + s)
                .single()
        };
        let cs = [
            LogChunk {
                offset: 0,
                data: b"one\ntw".to_vec(),
                received_at: t(0),
            },
            LogChunk {
                offset: 6,
                data: b"o\nthree\n".to_vec(),
                received_at: t(1500),
            },
        ];
        let mut start = true;
        let (out, end) = read_stamped_from(&cs, 0, &ORIGIN, &mut start);
        assert_eq!(end, 14);
        assert!(start);
        assert_eq!(
            String::from_utf8(out).expect("UTF-8"),
            "2025-12-06T05:46:40.000Z one\n\
             2025-12-06T05:46:40.000Z two\n\
             2025-12-06T05:46:41.500Z three\n"
        );
        // A reader in the middle of a line stamps only the lines that start after it.
        let mut start = false;
        let (out, _) = read_stamped_from(&cs, 4, &ORIGIN, &mut start);
        assert_eq!(
            String::from_utf8(out).expect("UTF-8"),
            "two\n2025-12-06T05:46:41.500Z three\n"
        );
        // The plain read of the same chunks has no stamps (the control).
        assert_eq!(read_from(&cs, 0, &ORIGIN).0, b"one\ntwo\nthree\n".to_vec());
    }
}
