//! Ids seen recently (bounded, oldest forgotten first): how both rebuilds tell a repeated id.

use std::collections::{HashSet, VecDeque};

/// How many ids are remembered.
pub const RECENT_IDS: usize = 1 << 17;

#[derive(Debug, Default)]
pub(crate) struct RecentIds {
    order: VecDeque<u64>,
    set: HashSet<u64>,
}

impl RecentIds {
    pub(crate) fn insert(&mut self, id: u64) {
        if self.set.insert(id) {
            self.order.push_back(id);
            if self.order.len() > RECENT_IDS
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }

    pub(crate) fn contains(&self, id: u64) -> bool {
        self.set.contains(&id)
    }
}
