//! `profile:hz:N`: advice sampled on every thread of the target, N times per second
//! of the thread's CPU time, by the agent's timers.

use anyhow::{anyhow, bail, Result};
use weft_ir::AttachPoint;

use super::{Cx, PointcutKind, ProfileSpec, Resolved};

pub struct Profile;

impl PointcutKind for Profile {
    fn handles(&self, a: &AttachPoint) -> bool {
        matches!(a, AttachPoint::Profile { .. })
    }

    fn resolve(
        &self,
        a: &AttachPoint,
        probe_index: usize,
        name: u32,
        _cx: &mut Cx<'_>,
        out: &mut Resolved,
    ) -> Result<()> {
        let AttachPoint::Profile { hz } = a else {
            return Ok(());
        };
        if out.profiles.len() == weft_abi::MAX_PROFILES {
            bail!(
                "{a}: at most {} profile probes per program",
                weft_abi::MAX_PROFILES
            );
        }
        let hz = u32::try_from(*hz).ok().filter(|h| (1..=10_000).contains(h));
        let hz = hz.ok_or_else(|| anyhow!("{a}: the rate must be 1 to 10000 Hz"))?;
        out.profiles.push(ProfileSpec {
            hz,
            probe: name,
            body: probe_index,
        });
        Ok(())
    }
}
