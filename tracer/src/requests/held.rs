//! Decided outcomes held back for a late loss report, for both rebuilders: the loss counter
//! is polled, so a loss span can be reported after the requests it overlaps were decided.

use std::collections::BTreeMap;

use super::outcome::{Incomplete, Outcome};

/// How long (event time) an outcome is held back for a late loss report.
pub const HOLD_NS: u64 = 1_000_000_000;

/// Outcomes decided and not yet handed out, ordered by (decision ts, id).
#[derive(Debug, Default)]
pub(super) struct Held {
    outcomes: BTreeMap<(u64, u64), Outcome>,
}

impl Held {
    /// Holds `outcome`, decided at `ts`; `id` (unique among held outcomes) orders outcomes
    /// decided at the same ts.
    pub fn insert(&mut self, ts: u64, id: u64, outcome: Outcome) {
        self.outcomes.insert((ts, id), outcome);
    }

    /// Every held complete outcome that `span` overlaps becomes incomplete with `reason`.
    pub fn lose(&mut self, span: (u64, u64), reason: &str) {
        for outcome in self.outcomes.values_mut() {
            if let Outcome::Complete(r) = outcome
                && overlaps(span, r.t_arrive_ns, r.t_done_ns)
            {
                *outcome = incomplete(r.req_id, reason);
            }
        }
    }

    /// Outcomes decided at least [`HOLD_NS`] before `now`, in order.
    pub fn drain(&mut self, now: u64) -> Vec<Outcome> {
        let mut out = Vec::new();
        while let Some(entry) = self.outcomes.first_entry() {
            if entry.key().0.saturating_add(HOLD_NS) > now {
                break;
            }
            out.push(entry.remove());
        }
        out
    }

    /// Every held outcome, in order.
    pub fn take_all(&mut self) -> Vec<Outcome> {
        std::mem::take(&mut self.outcomes).into_values().collect()
    }
}

pub(super) fn incomplete(req_id: u64, reason: &str) -> Outcome {
    Outcome::Incomplete(Incomplete {
        req_id,
        reason: reason.to_owned(),
    })
}

/// Whether the closed interval `span` and `[from, to]` share an instant.
pub(super) fn overlaps(span: (u64, u64), from: u64, to: u64) -> bool {
    span.0 <= to && span.1 >= from
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::synthetic::record_of_parts;
    use crate::requests::{Hits, PARTS};

    /// A complete outcome of request `id` from `arrive` to `arrive + 100`.
    fn complete(id: u64, arrive: u64) -> Outcome {
        let mut parts = [0; PARTS];
        parts[0] = 100;
        Outcome::Complete(record_of_parts(id, 200, arrive, parts, Hits::default()))
    }

    #[test]
    fn drains_in_decision_order_once_held_long_enough_and_a_loss_reaches_only_what_it_overlaps() {
        let mut held = Held::default();
        held.insert(1_100, 2, complete(2, 1_000));
        held.insert(1_100, 1, complete(1, 1_000));
        held.insert(5_100, 3, complete(3, 5_000));
        held.insert(9_000, 4, incomplete(4, "duplicate id"));
        held.lose((1_050, 1_060), "events lost");
        assert_eq!(held.drain(1_099 + HOLD_NS), Vec::new());
        assert_eq!(
            held.drain(1_100 + HOLD_NS),
            vec![incomplete(1, "events lost"), incomplete(2, "events lost")]
        );
        assert_eq!(
            held.take_all(),
            vec![complete(3, 5_000), incomplete(4, "duplicate id")]
        );
        assert_eq!(held.take_all(), Vec::new());
    }
}
