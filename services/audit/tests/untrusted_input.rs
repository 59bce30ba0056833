//! What an auditor's verifier reads — bundles, checkpoints, signed notes, key lists — may
//! come from anyone: it is refused or accepted, never a panic, whatever the bytes.

use allot_audit::bundle::Bundle;
use allot_audit::{Checkpoint, TrustedKeys};
use proptest::prelude::*;

proptest! {
    #[test]
    fn bundles_are_read_or_refused(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = Bundle::from_tar(&bytes);
    }

    #[test]
    fn checkpoints_and_keys_are_read_or_refused(text in "\\PC{0,300}") {
        let _ = Checkpoint::parse(&text);
        let _ = TrustedKeys::parse(&text);
        let _ = allot_audit::Verifier::from_vkey(&text);
        let _ = allot_audit::Signer::from_skey(&text);
    }

    #[test]
    fn checkpoint_shaped_text_is_read_or_refused(origin in "[a-z./]{0,20}", size in any::<u64>(), root in "[A-Za-z0-9+/=]{0,60}", rest in "\\PC{0,80}") {
        let text = format!("{origin}\n{size}\n{root}\n{rest}\n");
        let _ = Checkpoint::parse(&text);
    }
}
