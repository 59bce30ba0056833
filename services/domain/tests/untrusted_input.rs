//! What reaches the domain from outside — byte quantities from the CLI and the API, GPU
//! inventories from nodes — is refused or accepted, never a panic, whatever the input.

use allot_domain::{GpuDevice, MemoryEnforcement, parse_bytes};
use proptest::prelude::*;

fn gpu() -> impl Strategy<Value = GpuDevice> {
    (
        ".{0,80}",
        any::<u32>(),
        ".{0,80}",
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(uuid, index, model, memory_bytes, healthy, degraded)| GpuDevice {
                uuid,
                index,
                model,
                memory_bytes,
                healthy,
                degraded,
                mig: None,
                memory_enforcement: MemoryEnforcement::default(),
                nvlink_domain: None,
            },
        )
}

proptest! {
    #[test]
    fn quantities_parse_or_are_refused(input in "\\PC{0,40}") {
        let _ = parse_bytes(&input);
    }

    #[test]
    fn plain_numbers_are_bytes_up_to_a_pebibyte(n in any::<u64>()) {
        let parsed = parse_bytes(&n.to_string());
        if n <= 1 << 50 {
            prop_assert_eq!(parsed, Ok(n));
        } else {
            prop_assert!(parsed.is_err());
        }
    }

    #[test]
    fn quantities_with_units_are_exact_or_refused(n in 0u64..=1 << 30, unit in prop_oneof!["KiB", "MiB", "GiB", "KB", "MB", "GB"]) {
        let scale: u64 = match unit.as_str() {
            "KiB" => 1 << 10, "MiB" => 1 << 20, "GiB" => 1 << 30,
            "KB" => 1_000, "MB" => 1_000_000, _ => 1_000_000_000,
        };
        match parse_bytes(&format!("{n}{unit}")) {
            Ok(b) => prop_assert_eq!(b, n * scale),
            Err(_) => prop_assert!(n * scale > 1 << 50),
        }
    }

    #[test]
    fn inventories_are_checked_never_trusted(gpus in proptest::collection::vec(gpu(), 0..40)) {
        if allot_domain::node::check_inventory(&gpus).is_ok() {
            prop_assert!(gpus.len() <= 32);
            prop_assert!(gpus.iter().all(|g| g.model.len() <= 64));
        }
    }
}
