//! NVIDIA XID error codes: what each class means for the job and the GPU.
//!
//! Source: NVIDIA, "XID Errors" (docs.nvidia.com/deploy/xid-errors), the catalogue of
//! driver error codes, and its guidance on which need a GPU reset. This table is the one
//! place Allot classifies them; the agent acts on the class:
//!
//! | class | codes | the attempt on that GPU | the GPU |
//! |---|---|---|---|
//! | application fault | 13, 31, 43, 45, 68 | fails (counts against the job's retries) | stays healthy |
//! | contained memory error | 94 | stopped and requeued (not the job's fault) | stays healthy |
//! | informational | 63, 92 | runs on | degraded: keeps its jobs, no new work |
//! | drain and reset | 48, 64, 74, 79, 95, 119, 120 | stopped and requeued elsewhere | unhealthy: no new work |
//!
//! A code not in the table is treated as needing a drain: a GPU in an unknown state gets no
//! new work until an operator has looked at it.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum XidClass {
    /// The application did something wrong on the GPU; the GPU is fine.
    ApplicationFault,
    /// An uncorrectable memory error the driver contained to one process.
    ContainedMemoryError,
    /// Recorded, nothing to do.
    Informational,
    /// The GPU needs a drain and a reset before it takes work again.
    DrainAndReset,
}

/// The codes Allot knows: code, class, what NVIDIA calls it.
pub const XIDS: &[(u32, XidClass, &str)] = &[
    (13, XidClass::ApplicationFault, "graphics engine exception"),
    (31, XidClass::ApplicationFault, "GPU memory page fault"),
    (43, XidClass::ApplicationFault, "GPU stopped processing"),
    (
        45,
        XidClass::ApplicationFault,
        "preemptive cleanup, due to previous errors",
    ),
    (68, XidClass::ApplicationFault, "NVDEC0 exception"),
    (94, XidClass::ContainedMemoryError, "contained ECC error"),
    (
        63,
        XidClass::Informational,
        "ECC page retirement or row remapping recording event",
    ),
    (
        92,
        XidClass::Informational,
        "high single-bit ECC error rate",
    ),
    (48, XidClass::DrainAndReset, "double-bit ECC error"),
    (
        64,
        XidClass::DrainAndReset,
        "ECC page retirement or row remapper recording failure",
    ),
    (74, XidClass::DrainAndReset, "NVLink error"),
    (79, XidClass::DrainAndReset, "GPU has fallen off the bus"),
    (95, XidClass::DrainAndReset, "uncontained ECC error"),
    (119, XidClass::DrainAndReset, "GSP RPC timeout"),
    (120, XidClass::DrainAndReset, "GSP error"),
];

/// The class of `code`; unknown codes need a drain.
pub fn classify(code: u32) -> XidClass {
    XIDS.iter()
        .find(|(c, _, _)| *c == code)
        .map_or(XidClass::DrainAndReset, |(_, class, _)| *class)
}

/// "XID 79 (GPU has fallen off the bus)".
pub fn describe(code: u32) -> String {
    match XIDS.iter().find(|(c, _, _)| *c == code) {
        Some((_, _, name)) => format!("XID {code} ({name})"),
        None => format!("XID {code} (not in Allot's table: treated as needing a drain)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_the_issue_names() {
        for c in [13, 31, 43, 45, 68] {
            assert_eq!(classify(c), XidClass::ApplicationFault, "{c}");
        }
        assert_eq!(classify(94), XidClass::ContainedMemoryError);
        for c in [63, 92] {
            assert_eq!(classify(c), XidClass::Informational, "{c}");
        }
        for c in [48, 64, 74, 79, 95, 119, 120] {
            assert_eq!(classify(c), XidClass::DrainAndReset, "{c}");
        }
        assert_eq!(
            classify(9999),
            XidClass::DrainAndReset,
            "unknown codes drain"
        );
        assert_eq!(describe(79), "XID 79 (GPU has fallen off the bus)");
        let mut codes: Vec<u32> = XIDS.iter().map(|x| x.0).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), XIDS.len(), "each code once");
    }
}
