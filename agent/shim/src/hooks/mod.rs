//! The exported entry points, by what they police.

pub mod entry;
pub mod info;
pub mod launch;
pub mod memory;
