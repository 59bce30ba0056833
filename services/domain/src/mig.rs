//! MIG (Multi-Instance GPU) geometry: the GPU-instance profiles of each supported board and
//! where they may be placed, as `nvidia-smi mig -lgip` / `-lgipp` report them. A GPU has 8
//! memory slices and 7 compute slices; an instance of a profile takes `memory_slices`
//! consecutive memory slices starting at one of its allowed `starts`, and instances never
//! overlap. Profiles are identified by their id (the GPU-instance profile id NVML and
//! `nvidia-smi` use), their slice counts and their memory, not only by name: names vary by
//! board and driver.
//!
//! Source: NVIDIA Multi-Instance GPU User Guide (r570), "Supported MIG Profiles" (A100 and
//! H100/H200 tables); placements as `nvidia-smi mig -lgipp` lists them on those boards.

use std::fmt;

/// A GPU-instance profile of one board.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigProfile {
    /// The GPU-instance profile id (`nvidia-smi mig -lgip`, column ID).
    pub id: u32,
    pub name: &'static str,
    pub compute_slices: u8,
    pub memory_slices: u8,
    /// Memory of one instance, MiB (nominal: the size in its name).
    pub memory_mib: u32,
    /// Memory slices where an instance may start.
    pub starts: &'static [u8],
    /// At most this many instances on one GPU.
    pub max_instances: u8,
}

/// A board's MIG geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigGeometry {
    /// The board, as the simulator and the inventory name it.
    pub board: &'static str,
    pub memory_slices: u8,
    pub compute_slices: u8,
    pub profiles: &'static [MigProfile],
}

const ONE: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const TWO: &[u8] = &[0, 2, 4, 6];
const TWO_G: &[u8] = &[0, 2, 4];
const THREE: &[u8] = &[0, 4];
const WHOLE: &[u8] = &[0];

/// The seven profiles every supported board has, with the memory sizes in their names
/// (GiB). `memory_mib` is that nominal size; the driver reports a little less (H100 1g.10gb:
/// 9.75 GiB), which is why [`MigGeometry::profile_by_shape`] allows 10%.
macro_rules! profiles {
    ($g1:literal, $g2:literal, $g4:literal, $g8:literal) => {
        &[
            profile(19, concat!("1g.", $g1, "gb"), 1, 1, $g1, ONE, 7),
            profile(20, concat!("1g.", $g1, "gb+me"), 1, 1, $g1, ONE, 1),
            profile(15, concat!("1g.", $g2, "gb"), 1, 2, $g2, TWO, 4),
            profile(14, concat!("2g.", $g2, "gb"), 2, 2, $g2, TWO_G, 3),
            profile(9, concat!("3g.", $g4, "gb"), 3, 4, $g4, THREE, 2),
            profile(5, concat!("4g.", $g4, "gb"), 4, 4, $g4, WHOLE, 1),
            profile(0, concat!("7g.", $g8, "gb"), 7, 8, $g8, WHOLE, 1),
        ]
    };
}

const fn profile(
    id: u32,
    name: &'static str,
    compute_slices: u8,
    memory_slices: u8,
    gib: u32,
    starts: &'static [u8],
    max_instances: u8,
) -> MigProfile {
    MigProfile {
        id,
        name,
        compute_slices,
        memory_slices,
        memory_mib: gib * 1024,
        starts,
        max_instances,
    }
}

/// A board with the usual 8 memory and 7 compute slices.
const fn board(board: &'static str, profiles: &'static [MigProfile]) -> MigGeometry {
    MigGeometry {
        board,
        memory_slices: 8,
        compute_slices: 7,
        profiles,
    }
}

/// The boards whose MIG geometry Allot knows.
pub const GEOMETRIES: [MigGeometry; 4] = [
    board("A100-40GB", profiles!(5, 10, 20, 40)),
    board("A100-80GB", profiles!(10, 20, 40, 80)),
    board("H100-80GB", profiles!(10, 20, 40, 80)),
    board("H200-141GB", profiles!(18, 35, 71, 141)),
];

/// The geometry of `board` (e.g. `H200-141GB`, or `NVIDIA H200` with its memory in MiB).
pub fn geometry(board: &str, memory_mib: Option<u64>) -> Option<&'static MigGeometry> {
    if let Some(g) = GEOMETRIES
        .iter()
        .find(|g| g.board.eq_ignore_ascii_case(board))
    {
        return Some(g);
    }
    // Inventory names ("NVIDIA A100-SXM4-80GB", "NVIDIA H200"): the family, told apart by
    // memory where one family has two sizes.
    let upper = board.to_ascii_uppercase();
    let gib = memory_mib.map(|m| m / 1024);
    let family = |name: &str| GEOMETRIES.iter().find(|g| g.board == name);
    if upper.contains("H200") {
        family("H200-141GB")
    } else if upper.contains("H100") {
        family("H100-80GB")
    } else if upper.contains("A100") {
        match gib {
            Some(g) if g > 48 => family("A100-80GB"),
            Some(_) => family("A100-40GB"),
            None if upper.contains("80GB") => family("A100-80GB"),
            None if upper.contains("40GB") => family("A100-40GB"),
            None => None,
        }
    } else {
        None
    }
}

/// The profile of any known board with this name (case-insensitive), e.g. `1g.18gb`.
pub fn profile_named(name: &str) -> Option<&'static MigProfile> {
    GEOMETRIES.iter().find_map(|g| g.profile_named(name))
}

/// Every profile name of every known board, each once.
pub fn profile_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = GEOMETRIES
        .iter()
        .flat_map(|g| g.profiles.iter().map(|p| p.name))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

impl MigGeometry {
    /// This board's profile with this name (case-insensitive).
    pub fn profile_named(&self, name: &str) -> Option<&'static MigProfile> {
        self.profiles
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name.trim()))
    }

    pub fn profile(&self, id: u32) -> Option<&'static MigProfile> {
        self.profiles.iter().find(|p| p.id == id)
    }

    /// The profile with these slice counts and about this memory (within 10%): how a
    /// profile is found when the driver names it differently.
    pub fn profile_by_shape(
        &self,
        compute_slices: u8,
        memory_slices: u8,
        memory_mib: u32,
        media_extensions: bool,
    ) -> Option<&'static MigProfile> {
        self.profiles.iter().find(|p| {
            p.compute_slices == compute_slices
                && p.memory_slices == memory_slices
                && (p.id == 20) == media_extensions
                && u64::from(p.memory_mib.abs_diff(memory_mib)) * 10 <= u64::from(p.memory_mib)
        })
    }

    /// Checks `layout` (profile id, start) against this geometry.
    pub fn validate(&self, layout: &[(u32, u8)]) -> Result<(), MigError> {
        let mut used = [false; 8];
        let mut compute = 0u8;
        let mut counts: Vec<(u32, u8)> = Vec::new();
        for &(id, start) in layout {
            let p = self.profile(id).ok_or(MigError::UnknownProfile(id))?;
            if !p.starts.contains(&start) {
                return Err(MigError::BadStart {
                    profile: p.name,
                    start,
                    allowed: p.starts,
                });
            }
            for slot in start..start + p.memory_slices {
                let taken = used.get_mut(usize::from(slot)).ok_or(MigError::BadStart {
                    profile: p.name,
                    start,
                    allowed: p.starts,
                })?;
                if *taken {
                    return Err(MigError::Overlap {
                        profile: p.name,
                        slot,
                    });
                }
                *taken = true;
            }
            compute += p.compute_slices;
            if compute > self.compute_slices {
                return Err(MigError::TooMuchCompute(self.compute_slices));
            }
            let n = match counts.iter_mut().find(|c| c.0 == id) {
                Some(c) => {
                    c.1 += 1;
                    c.1
                }
                None => {
                    counts.push((id, 1));
                    1
                }
            };
            if n > p.max_instances {
                return Err(MigError::TooMany {
                    profile: p.name,
                    max: p.max_instances,
                });
            }
        }
        Ok(())
    }

    /// Where an instance of `id` could be added to `layout`: the first allowed start that
    /// keeps the layout valid.
    pub fn place(&self, layout: &[(u32, u8)], id: u32) -> Option<u8> {
        let p = self.profile(id)?;
        p.starts.iter().copied().find(|&start| {
            let mut next = layout.to_vec();
            next.push((id, start));
            self.validate(&next).is_ok()
        })
    }

    /// Every valid layout, each once (placements in increasing start order).
    pub fn all_layouts(&self) -> Vec<Vec<(u32, u8)>> {
        let mut out = vec![Vec::new()];
        let mut stack: Vec<Vec<(u32, u8)>> = vec![Vec::new()];
        while let Some(layout) = stack.pop() {
            let after = layout.last().map_or(0, |&(id, start)| {
                start + self.profile(id).map_or(1, |p| p.memory_slices)
            });
            for p in self.profiles {
                for &start in p.starts.iter().filter(|&&s| s >= after) {
                    let mut next = layout.clone();
                    next.push((p.id, start));
                    if self.validate(&next).is_ok() {
                        out.push(next.clone());
                        stack.push(next);
                    }
                }
            }
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigError {
    UnknownProfile(u32),
    BadStart {
        profile: &'static str,
        start: u8,
        allowed: &'static [u8],
    },
    Overlap {
        profile: &'static str,
        slot: u8,
    },
    TooMuchCompute(u8),
    TooMany {
        profile: &'static str,
        max: u8,
    },
}

impl fmt::Display for MigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigError::UnknownProfile(id) => write!(f, "no MIG profile {id} on this GPU"),
            MigError::BadStart {
                profile,
                start,
                allowed,
            } => write!(
                f,
                "{profile} cannot start at memory slice {start} (allowed: {allowed:?})"
            ),
            MigError::Overlap { profile, slot } => {
                write!(
                    f,
                    "{profile} would overlap another instance at memory slice {slot}"
                )
            }
            MigError::TooMuchCompute(max) => write!(f, "more than {max} compute slices"),
            MigError::TooMany { profile, max } => {
                write!(f, "more than {max} instances of {profile}")
            }
        }
    }
}

impl std::error::Error for MigError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> &'static MigGeometry {
        geometry("H200-141GB", None).expect("H200")
    }

    #[test]
    fn boards_are_found_by_name_and_memory() {
        assert_eq!(
            geometry("NVIDIA H200", Some(143_771)).map(|g| g.board),
            Some("H200-141GB")
        );
        assert_eq!(
            geometry("NVIDIA H100 80GB HBM3", None).map(|g| g.board),
            Some("H100-80GB")
        );
        assert_eq!(
            geometry("NVIDIA A100-SXM4-40GB", Some(40_960)).map(|g| g.board),
            Some("A100-40GB")
        );
        assert_eq!(
            geometry("NVIDIA A100 80GB PCIe", None).map(|g| g.board),
            Some("A100-80GB")
        );
        assert_eq!(geometry("Tesla T4", Some(15_360)), None, "no MIG on a T4");
        let p = h200().profile_by_shape(3, 4, 69_888, false).expect("3g");
        assert_eq!((p.id, p.name), (9, "3g.71gb"));
        assert_eq!(
            h200().profile_by_shape(1, 1, 16_640, true).map(|p| p.id),
            Some(20)
        );
        let h100 = geometry("H100-80GB", None).expect("H100");
        assert_eq!(
            h100.profile_by_shape(1, 1, 9_984, false).map(|p| p.name),
            Some("1g.10gb")
        );
    }

    #[test]
    fn every_valid_layout_is_reachable_and_invalid_ones_are_refused() {
        for g in &GEOMETRIES {
            let layouts = g.all_layouts();
            // Seven 1g instances, 4g+3g, 3g+3g, 7g, mixed ones: many, and each valid.
            assert!(layouts.len() > 50, "{}: {}", g.board, layouts.len());
            for layout in &layouts {
                assert_eq!(g.validate(layout), Ok(()), "{}: {layout:?}", g.board);
                // Built one instance at a time with explicit placements, in any order.
                let mut built: Vec<(u32, u8)> = Vec::new();
                for &(id, start) in layout.iter().rev() {
                    built.push((id, start));
                    assert_eq!(g.validate(&built), Ok(()));
                }
            }
            assert!(layouts.contains(&vec![(5, 0), (9, 4)]), "4g + 3g");
            assert!(
                layouts.contains(&(0..7).map(|s| (19, s)).collect::<Vec<_>>()),
                "7 x 1g"
            );
            assert!(layouts.contains(&vec![(0, 0)]), "7g");
        }
        let g = h200();
        let refused = [
            (vec![(9, 2)], "cannot start at memory slice 2"),
            (vec![(9, 0), (14, 2)], "overlap"),
            (
                vec![(20, 0), (20, 1)],
                "more than 1 instances of 1g.18gb+me",
            ),
            (vec![(0, 0), (19, 0)], "overlap"),
            (vec![(42, 0)], "no MIG profile 42"),
            (vec![(19, 7)], "cannot start at memory slice 7"),
        ];
        for (layout, want) in refused {
            let err = g.validate(&layout).expect_err(want).to_string();
            assert!(err.contains(want), "{layout:?}: {err}");
        }
        assert_eq!(
            g.place(&[(9, 0)], 9),
            Some(4),
            "the second 3g goes to slice 4"
        );
        assert_eq!(g.place(&[(9, 0), (9, 4)], 19), None, "full");
        assert_eq!(g.place(&[(5, 0)], 14), Some(4));
    }
}
