//! How many bytes CUDA arrays take, from their descriptors: what the shim charges to the
//! job's budget before it lets `cuArrayCreate`, `cuArray3DCreate` or
//! `cuMipmappedArrayCreate` through.

/// Bytes per channel of a `CUarray_format`. Formats this table does not know (block
/// compressed, video formats) are charged 4 bytes a channel, never less.
pub fn format_bytes(format: u32) -> u64 {
    match format {
        0x01 | 0x08 => 1,        // U8, S8
        0x02 | 0x09 | 0x10 => 2, // U16, S16, HALF
        0x03 | 0x0a | 0x20 => 4, // U32, S32, FLOAT
        _ => 4,
    }
}

/// Bytes of an array `width` × `height` × `depth` (0 counts as 1) of `channels` channels.
pub fn array_bytes(width: u64, height: u64, depth: u64, format: u32, channels: u32) -> u64 {
    width
        .max(1)
        .saturating_mul(height.max(1))
        .saturating_mul(depth.max(1))
        .saturating_mul(u64::from(channels.max(1)))
        .saturating_mul(format_bytes(format))
}

/// Bytes of a mipmapped array: every level, each half the size of the one before in each
/// dimension the array has.
pub fn mipmapped_bytes(
    width: u64,
    height: u64,
    depth: u64,
    format: u32,
    channels: u32,
    levels: u32,
) -> u64 {
    (0..levels.clamp(1, 64)).fold(0u64, |total, level| {
        let shrink = |d: u64| if d == 0 { 0 } else { (d >> level).max(1) };
        total.saturating_add(array_bytes(
            shrink(width),
            shrink(height),
            shrink(depth),
            format,
            channels,
        ))
    })
}

/// The pitch `cuMemAllocPitch` is charged before the driver says the real one: the row
/// rounded up to 512 bytes (what current GPUs align to). The charge is corrected to the
/// real pitch afterwards.
pub fn pitch_estimate(width_bytes: u64) -> u64 {
    width_bytes.div_ceil(512).saturating_mul(512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_descriptor() {
        assert_eq!(array_bytes(1024, 0, 0, 0x20, 4), 16 * 1024);
        assert_eq!(array_bytes(64, 64, 64, 0x01, 1), 64 * 64 * 64);
        // An unknown format is never charged less than 4 bytes a channel.
        assert_eq!(array_bytes(10, 10, 0, 0xb0, 1), 400);
        // 8x8 float, 4 levels: 64 + 16 + 4 + 1 texels.
        assert_eq!(mipmapped_bytes(8, 8, 0, 0x20, 1, 4), 4 * (64 + 16 + 4 + 1));
        assert_eq!(pitch_estimate(1), 512);
        assert_eq!(pitch_estimate(1024), 1024);
    }
}
