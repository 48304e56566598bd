//! The sampled per-phase split: on-CPU samples counted by the phase frame their user stack
//! holds (`gw_phase_<phase>`, see [`Phase::frame`]). It needs no probe hit, so it comes with
//! every session that samples; the exact split (`cpu.<phase>` parts) needs the `phase` site,
//! ~9 more uprobe traps a request (`--phases`).
//!
//! A sample stands for one sampling period of CPU time, so a phase's samples × period
//! estimate its on-CPU time. Samples outside every phase frame (hyper and the runtime
//! between phases, the response write) count as `outside`; samples with no stack, or whose
//! user frames could not be named, as `unresolved`.

use tracer_ebpf::sites::Phase;

use super::fold::{Folded, NO_STACK};

/// Samples of one group of requests, by phase frame.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PhaseSamples {
    /// Every sample of the group.
    pub samples: u64,
    /// Indexed like [`Phase::ALL`].
    pub by_phase: [u64; Phase::ALL.len()],
    /// Samples whose stack holds no phase frame.
    pub outside: u64,
    /// Samples without a stack, or whose frames could not be named.
    pub unresolved: u64,
}

impl PhaseSamples {
    /// Counts the on-CPU samples of `folded` (one count per sample, stacks root first).
    pub fn from_folded(folded: &Folded) -> Self {
        let mut counts = PhaseSamples::default();
        for (stack, count) in folded.iter() {
            counts.samples += count;
            // The root is the part (`cpu` or `cpu.<phase>`); the innermost phase frame wins.
            let frames = stack.split(';').skip(1);
            let mut phase = None;
            let mut named = false;
            for frame in frames {
                if let Some(found) = Phase::from_frame(frame) {
                    phase = Some(found);
                }
                named |= frame != NO_STACK && frame != "[unknown]" && !frame.ends_with("_[k]");
            }
            match phase {
                Some(phase) => counts.by_phase[phase_index(phase)] += count,
                None if named => counts.outside += count,
                None => counts.unresolved += count,
            }
        }
        counts
    }

    pub fn phase(&self, phase: Phase) -> u64 {
        self.by_phase[phase_index(phase)]
    }

    /// Samples that fell in some phase frame.
    pub fn in_phases(&self) -> u64 {
        self.by_phase.iter().sum()
    }
}

fn phase_index(phase: Phase) -> usize {
    Phase::ALL
        .iter()
        .position(|p| *p == phase)
        .expect("every phase is in Phase::ALL")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_count_under_their_innermost_phase_frame() {
        let folded: Folded = "\
cpu;start;poll;gw_phase_upstream;writev;tcp_sendmsg_[k] 5
cpu;start;poll;gw_phase_auth;hmac 2
cpu.vault;start;gw_phase_vault;decrypt 1
cpu;start;poll;hyper::write 3
cpu;[unknown] 4
cpu;[no stack] 1
cpu;entry_SYSCALL_64_[k];do_syscall_64_[k] 2
"
        .parse()
        .unwrap();
        let counts = PhaseSamples::from_folded(&folded);
        assert_eq!(counts.samples, 18);
        assert_eq!(counts.phase(Phase::Upstream), 5);
        assert_eq!(counts.phase(Phase::Auth), 2);
        assert_eq!(counts.phase(Phase::Vault), 1);
        assert_eq!(counts.in_phases(), 8);
        assert_eq!(
            counts.outside, 3,
            "named frames, none of them a phase frame"
        );
        assert_eq!(
            counts.unresolved, 7,
            "no stack, [unknown], or kernel frames only"
        );
    }
}
