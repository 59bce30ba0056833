//! Job logs as the control plane keeps them: each attempt's combined stdout/stderr, shipped
//! by its node in chunks while it runs, of which the last [`KEPT_BYTES`] are kept. Offsets
//! are byte positions in the attempt's log on its node, so a reader can resume where it
//! stopped and see exactly what was not kept.

use std::ops::Range;

use crate::format_bytes;

/// How much of the end of each attempt's log the control plane keeps.
pub const KEPT_BYTES: u64 = 4 * 1024 * 1024;

/// The largest chunk a node may send.
pub const CHUNK_MAX_BYTES: u64 = 256 * 1024;

/// The part of a log to ship next, given what was shipped (`shipped`, the offset after it),
/// how long the log is now and how much may go in one round: `None` when nothing is new.
/// Output the control plane would not keep anyway (more than [`KEPT_BYTES`] behind the end)
/// is skipped, so a node that falls behind a fast writer catches up instead of shipping
/// what is dropped on arrival.
pub fn next_range(shipped: u64, len: u64, budget: u64) -> Option<Range<u64>> {
    if len <= shipped || budget == 0 {
        return None;
    }
    let from = shipped.max(len.saturating_sub(KEPT_BYTES));
    Some(from..len.min(from.saturating_add(budget)))
}

/// `range` in chunks of at most [`CHUNK_MAX_BYTES`].
pub fn chunks(range: Range<u64>) -> impl Iterator<Item = Range<u64>> {
    let end = range.end;
    (range.start..end)
        .step_by(usize::try_from(CHUNK_MAX_BYTES).unwrap_or(usize::MAX))
        .map(move |s| s..end.min(s + CHUNK_MAX_BYTES))
}

/// One stored chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    pub offset: u64,
    pub data: Vec<u8>,
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
                "the whole log is on node {node}, in its agent's data directory at logs/{}.{}.log",
                self.job_id, self.attempt
            ),
            None => "the node that ran it has the whole log".to_owned(),
        };
        format!(
            "\n[allot: {} of output not kept here (the control plane keeps the last {} of \
             each attempt); {where_}]\n",
            format_bytes(bytes),
            format_bytes(KEPT_BYTES)
        )
    }
}

/// What a reader at `cursor` gets from `chunks` (ordered by offset, as stored): the bytes
/// from `cursor` on, with a note where output is missing, and the cursor after them.
/// Overlapping chunks (a chunk sent twice) give their bytes once.
pub fn read_from(chunks: &[LogChunk], cursor: u64, origin: &LogOrigin<'_>) -> (Vec<u8>, u64) {
    let mut out = Vec::new();
    let mut at = cursor;
    for c in chunks {
        if c.end() <= at {
            continue;
        }
        if c.offset > at {
            out.extend_from_slice(origin.gap_note(c.offset - at).as_bytes());
            at = c.offset;
        }
        let skip = usize::try_from(at - c.offset).unwrap_or(usize::MAX);
        out.extend_from_slice(c.data.get(skip..).unwrap_or_default());
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
    fn shipping_skips_what_would_not_be_kept() {
        let len = KEPT_BYTES * 3;
        assert_eq!(
            next_range(0, len, CHUNK_MAX_BYTES),
            Some(2 * KEPT_BYTES..2 * KEPT_BYTES + CHUNK_MAX_BYTES)
        );
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
        assert!(text.contains("4.9 KiB of output not kept here"), "{text}");
        assert!(text.contains("node gpu-3"), "{text}");
        assert!(text.contains("logs/j1.2.log"), "{text}");
        assert!(text.ends_with("]\ntail\n"), "{text}");
    }

    #[test]
    fn a_chunk_sent_twice_is_read_once() {
        let cs = [chunk(0, "abc"), chunk(0, "abc"), chunk(2, "cde")];
        assert_eq!(read_from(&cs, 0, &ORIGIN), (b"abcde".to_vec(), 5));
    }
}
