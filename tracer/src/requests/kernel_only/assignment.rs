//! What a group of candidates forces: given each upstream request's candidate client requests,
//! which owner every way of giving each upstream request a distinct candidate agrees on. A
//! bipartite matching (Kuhn's augmenting paths) and, per client, one search per option it has:
//! polynomial in the group, which [`MAX_GROUP`] bounds.

use std::collections::HashMap;

use super::matcher::{MAX_GROUP, Serial};

/// What the candidates force: per upstream request its client (`None`: not forced); per
/// client not forced to an upstream request, whether it is forced to have none (`true`) or
/// ambiguous (`false`).
pub struct Forced {
    pub ups: Vec<(Serial, Option<Serial>)>,
    pub clients: Vec<(Serial, bool)>,
}

/// Every upstream request has exactly one owner among its candidates; a client has at most
/// one upstream request. An owner (or no upstream request) is forced when every assignment
/// that gives each upstream request a distinct candidate agrees on it. Over [`MAX_GROUP`]
/// requests, or with no such assignment, nothing is forced.
pub fn forced(clients: &[Serial], ups: &[Serial], cands: impl Fn(Serial) -> Vec<Serial>) -> Forced {
    let ci: HashMap<Serial, usize> = clients.iter().enumerate().map(|(i, &c)| (c, i)).collect();
    let edges: Vec<Vec<usize>> = ups
        .iter()
        .map(|&u| cands(u).iter().filter_map(|c| ci.get(c).copied()).collect())
        .collect();
    let nothing = || Forced {
        ups: ups.iter().map(|&u| (u, None)).collect(),
        clients: clients.iter().map(|&c| (c, false)).collect(),
    };
    if clients.len() + ups.len() > MAX_GROUP {
        return nothing();
    }
    let mut m = Matching::new(clients.len(), &edges);
    if !(0..ups.len()).all(|u| m.augment(u, None)) {
        return nothing();
    }
    // Per client: the partners (upstream index, or None) some full assignment gives it.
    let mut options: Vec<Vec<Option<usize>>> = vec![Vec::new(); clients.len()];
    for (c, opts) in options.iter_mut().enumerate() {
        let mut candidates: Vec<Option<usize>> = vec![None];
        candidates.extend(
            edges
                .iter()
                .enumerate()
                .filter(|(_, e)| e.contains(&c))
                .map(|(u, _)| Some(u)),
        );
        for want in candidates {
            if m.feasible(c, want) {
                opts.push(want);
            }
        }
    }
    let mut owner: Vec<Option<Serial>> = vec![None; ups.len()];
    let mut rest = Vec::new();
    for (c, opts) in options.iter().enumerate() {
        match opts[..] {
            [Some(u)] => owner[u] = Some(clients[c]),
            [None] => rest.push((clients[c], true)),
            _ => rest.push((clients[c], false)),
        }
    }
    Forced {
        ups: ups.iter().copied().zip(owner).collect(),
        clients: rest,
    }
}

/// A matching of upstream requests (left) into clients (right), Kuhn's augmenting paths.
struct Matching<'a> {
    edges: &'a [Vec<usize>],
    /// client → upstream.
    of_client: Vec<Option<usize>>,
    /// upstream → client.
    of_up: Vec<Option<usize>>,
}

impl<'a> Matching<'a> {
    fn new(clients: usize, edges: &'a [Vec<usize>]) -> Self {
        Matching {
            edges,
            of_client: vec![None; clients],
            of_up: vec![None; edges.len()],
        }
    }

    /// Finds an augmenting path from upstream `u`, never through client `banned`.
    fn augment(&mut self, u: usize, banned: Option<usize>) -> bool {
        let mut seen = vec![false; self.of_client.len()];
        self.dfs(u, banned, &mut seen)
    }

    fn dfs(&mut self, u: usize, banned: Option<usize>, seen: &mut [bool]) -> bool {
        for i in 0..self.edges[u].len() {
            let c = self.edges[u][i];
            if seen[c] || Some(c) == banned {
                continue;
            }
            seen[c] = true;
            if self.of_client[c].is_none_or(|other| self.dfs(other, banned, seen)) {
                self.of_client[c] = Some(u);
                self.of_up[u] = Some(c);
                return true;
            }
        }
        false
    }

    /// Whether some full matching gives client `c` the upstream request `want` (or none).
    fn feasible(&self, c: usize, want: Option<usize>) -> bool {
        let mut trial = Matching {
            edges: self.edges,
            of_client: self.of_client.clone(),
            of_up: self.of_up.clone(),
        };
        let freed = trial.of_client[c].take();
        if let Some(u) = freed {
            trial.of_up[u] = None;
        }
        if let Some(u) = want {
            if let Some(other) = trial.of_up[u].take() {
                trial.of_client[other] = None;
            }
            trial.of_up[u] = Some(c);
            trial.of_client[c] = Some(u);
        }
        match freed {
            Some(u) if Some(u) != want => trial.augment(u, Some(c)),
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forced_assignments() {
        // u0: {a, b}, u1: {b}: u1 = b, so u0 = a.
        let f = forced(&[10, 11], &[0, 1], |u| {
            if u == 0 { vec![10, 11] } else { vec![11] }
        });
        assert_eq!(f.ups, [(0, Some(10)), (1, Some(11))]);
        // u0: {a, b}, u1: {a, b}, u2: {a, b, c}: u2 = c.
        let f = forced(&[10, 11, 12], &[0, 1, 2], |u| {
            if u == 2 {
                vec![10, 11, 12]
            } else {
                vec![10, 11]
            }
        });
        assert_eq!(f.ups, [(0, None), (1, None), (2, Some(12))]);
        assert_eq!(f.clients, [(10, false), (11, false)]);
        // u0: {a, b, c}: c could be free or joined: nothing forced.
        let f = forced(&[10, 11, 12], &[0], |_| vec![10, 11, 12]);
        assert_eq!(f.ups, [(0, None)]);
        // No way to give each its own: nothing forced.
        let f = forced(&[10], &[0, 1], |_| vec![10]);
        assert_eq!(f.ups, [(0, None), (1, None)]);
    }
}
