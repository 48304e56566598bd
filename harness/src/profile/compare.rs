//! `profile --compare DIR`: a Reading point that sets this session's tail beside an earlier
//! session's, from both sessions' own files: the ranking of the tail's parts (breakdown.json
//! `tail.parts`) and how much of the tail's scheduling other processes held (pictures.json
//! `wait.holders`), so a conclusion drawn from an earlier, costlier tracer can be checked.

use std::path::Path;

use session::breakdown::Breakdown;
use session::pictures::Pictures;

use crate::workspace::read_json;

/// What a session says of its tail.
#[derive(Debug, PartialEq)]
pub struct TailFacts {
    /// The tracer's mode (breakdown.json `attach_modes.mode`).
    pub mode: String,
    /// Parts by share of the tail's overhead, largest first (upstream left out).
    pub ranking: Vec<(String, f64)>,
    /// Share of the tail's charged scheduling held by other processes; `None` without the
    /// wait-for view.
    pub other_processes: Option<f64>,
}

/// The holder label of a task outside the gateway (`flame::wait`'s wording).
const OTHER_PROCESS: &str = "other process";

impl TailFacts {
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        Ok(Self::new(
            &read_json(&dir.join(session::breakdown::FILE))?,
            &read_json(&dir.join(session::pictures::FILE))?,
        ))
    }

    /// The same from a session's files already read.
    pub fn new(breakdown: &Breakdown, pictures: &Pictures) -> Self {
        let ranking: Vec<(String, f64)> = Breakdown::by_share(&breakdown.tail.parts)
            .into_iter()
            .filter_map(|(name, p)| Some((name.to_owned(), p.share?)))
            .filter(|(_, share)| *share > 0.0)
            .collect();
        let other_processes = pictures.wait.as_ref().map(|wait| {
            let total: u64 = wait.holders.iter().map(|h| h.ns).sum();
            let other: u64 = (wait.holders.iter())
                .filter(|h| h.holder.starts_with(OTHER_PROCESS))
                .map(|h| h.ns)
                .sum();
            other as f64 / total.max(1) as f64
        });
        TailFacts {
            mode: breakdown.mode().unwrap_or_default().to_owned(),
            ranking,
            other_processes,
        }
    }

    pub fn top(&self) -> String {
        self.ranking
            .iter()
            .take(3)
            .map(|(name, share)| format!("{name} {:.0}%", share * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How the ranking of the tail's first three parts moved.
enum Ranking {
    Holds,
    /// The same largest part, another order after it.
    SameFirst(String),
    /// The largest part then, and now ("none" without one).
    Changed(String, String),
}

/// The Reading point: `then` is the earlier session (its README linked as `link`).
#[derive(askama::Template)]
#[template(path = "profile/compare.md", escape = "none")]
struct Reading<'a> {
    now: &'a TailFacts,
    then: &'a TailFacts,
    link: &'a str,
    ranking: Ranking,
}

impl Reading<'_> {
    /// "25%", or "not measured".
    fn pct(&self, x: &Option<f64>) -> String {
        x.map_or("not measured".to_owned(), |x| format!("{:.0}%", x * 100.0))
    }
}

pub fn reading(now: &TailFacts, then: &TailFacts, link: &str) -> String {
    use askama::Template as _;
    let first = |t: &TailFacts| t.ranking.first().map(|(n, _)| n.clone());
    let order = |t: &TailFacts| -> Vec<String> {
        t.ranking.iter().take(3).map(|(n, _)| n.clone()).collect()
    };
    let ranking = if order(now) == order(then) {
        Ranking::Holds
    } else if first(now) == first(then) {
        Ranking::SameFirst(first(now).unwrap_or_default())
    } else {
        let name = |t| first(t).unwrap_or_else(|| "none".to_owned());
        Ranking::Changed(name(then), name(now))
    };
    Reading {
        now,
        then,
        link,
        ranking,
    }
    .render()
    .expect("the comparison renders")
}

#[cfg(test)]
mod tests {
    use super::*;
    use session::pictures::Holder;

    /// A recorded session with its tail's shares and the other processes' wait replaced.
    fn session(shares: &[(&str, f64)], other_ns: u64) -> TailFacts {
        let (mut breakdown, mut pictures, ..) =
            crate::profile::readme::tests::recorded("2026-12-02-25pct-0ms-hardened");
        for part in breakdown.tail.parts.values_mut() {
            part.share = part.share.map(|_| 0.0);
        }
        for (name, share) in shares {
            breakdown.tail.parts[*name].share = Some(*share);
        }
        breakdown
            .attach_modes
            .insert("mode".to_owned(), "lean + sample-hz=999".to_owned());
        let holder = |holder: &str, ns| Holder {
            holder: holder.to_owned(),
            ns,
        };
        pictures.wait.as_mut().unwrap().holders = vec![
            holder("other process · kworker/0:1H (pid 54)", other_ns),
            holder("another request · cpu", 1000 - other_ns),
        ];
        TailFacts::new(&breakdown, &pictures)
    }

    #[test]
    fn a_changed_ranking_and_the_other_processes_share_are_said() {
        let then = session(
            &[
                ("scheduling", 0.52),
                ("ledger_fsync", 0.36),
                ("signing", 0.06),
            ],
            250,
        );
        let now = session(
            &[
                ("ledger_fsync", 0.58),
                ("scheduling", 0.32),
                ("signing", 0.05),
            ],
            100,
        );
        assert_eq!(then.other_processes, Some(0.25));
        assert_eq!(then.mode, "lean + sample-hz=999");
        let text = reading(&now, &then, "../old");
        assert!(
            text.contains("the largest part was scheduling and is now ledger_fsync"),
            "{text}"
        );
        assert!(text.contains("scheduling 52%, ledger_fsync 36%, signing 6% then"));
        assert!(text.contains("held 25% of the tail's charged scheduling then and 10% now"));
        assert!(reading(&now, &now, "x").contains("the ranking of the first three parts holds"));
    }

    #[test]
    fn a_session_without_breakdown_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = TailFacts::read(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains("breakdown.json"), "{err:#}");
    }
}
