//! `profile --compare DIR`: a Reading point that sets this session's tail beside an earlier
//! session's, from both sessions' own files: the ranking of the tail's parts (breakdown.json
//! `tail.parts`) and how much of the tail's scheduling other processes held (pictures.json
//! `wait.holders`), so a conclusion drawn from an earlier, costlier tracer can be checked.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use serde::Deserialize;

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

#[derive(Deserialize)]
struct Breakdown {
    attach_modes: BTreeMap<String, String>,
    tail: Band,
}

#[derive(Deserialize)]
struct Band {
    parts: BTreeMap<String, PartShare>,
}

#[derive(Deserialize)]
struct PartShare {
    share: Option<f64>,
}

#[derive(Deserialize)]
struct Pictures {
    wait: Option<Wait>,
}

#[derive(Deserialize)]
struct Wait {
    holders: Vec<Held>,
}

#[derive(Deserialize)]
struct Held {
    holder: String,
    ns: u64,
}

/// The holder label of a task outside the gateway (`flame::wait`'s wording).
const OTHER_PROCESS: &str = "other process";

impl TailFacts {
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        Ok(Self::new(
            read_json(&dir.join("breakdown.json"))?,
            read_json(&dir.join("pictures.json"))?,
        ))
    }

    /// The same from a session's files already read.
    pub fn from_session(
        breakdown: &serde_json::Value,
        pictures: &serde_json::Value,
    ) -> anyhow::Result<Self> {
        Ok(Self::new(
            Breakdown::deserialize(breakdown).context("breakdown.json")?,
            Pictures::deserialize(pictures).context("pictures.json")?,
        ))
    }

    fn new(breakdown: Breakdown, pictures: Pictures) -> Self {
        let mut ranking: Vec<(String, f64)> = breakdown
            .tail
            .parts
            .into_iter()
            .filter_map(|(name, p)| Some((name, p.share?)))
            .filter(|(_, share)| *share > 0.0)
            .collect();
        ranking.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let other_processes = pictures.wait.map(|wait| {
            let total: u64 = wait.holders.iter().map(|h| h.ns).sum();
            let other: u64 = wait
                .holders
                .iter()
                .filter(|h| h.holder.starts_with(OTHER_PROCESS))
                .map(|h| h.ns)
                .sum();
            other as f64 / total.max(1) as f64
        });
        TailFacts {
            mode: breakdown
                .attach_modes
                .get("mode")
                .cloned()
                .unwrap_or_default(),
            ranking,
            other_processes,
        }
    }

    fn top(&self) -> String {
        self.ranking
            .iter()
            .take(3)
            .map(|(name, share)| format!("{name} {:.0}%", share * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The Reading point: `then` is the earlier session (its README linked as `link`).
pub fn reading(now: &TailFacts, then: &TailFacts, link: &str) -> String {
    let first = |t: &TailFacts| t.ranking.first().map(|(n, _)| n.clone());
    let order = |t: &TailFacts| -> Vec<String> {
        t.ranking.iter().take(3).map(|(n, _)| n.clone()).collect()
    };
    let ranking = if order(now) == order(then) {
        "the ranking of the first three parts holds".to_owned()
    } else if first(now) == first(then) {
        format!(
            "the largest part is the same ({}), the order after it changed",
            first(now).unwrap_or_default()
        )
    } else {
        format!(
            "the ranking changed: the largest part was {} and is now {}",
            first(then).unwrap_or_else(|| "none".to_owned()),
            first(now).unwrap_or_else(|| "none".to_owned())
        )
    };
    let pct =
        |x: Option<f64>| x.map_or("not measured".to_owned(), |x| format!("{:.0}%", x * 100.0));
    format!(
        "Against the earlier session [{link}]({link}) (tracer mode `{}`): the tail's parts were {} then and are {} now, so {ranking}. \
         Other processes held {} of the tail's charged scheduling then and {} now.",
        then.mode,
        then.top(),
        now.top(),
        pct(then.other_processes),
        pct(now.other_processes),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::fs;

    fn session(dir: &Path, shares: &[(&str, f64)], other_ns: u64) {
        let parts: serde_json::Map<String, serde_json::Value> = shares
            .iter()
            .map(|(n, s)| ((*n).to_owned(), json!({ "mean_us": 1.0, "share": s })))
            .chain([(
                "upstream".to_owned(),
                json!({ "mean_us": 5.0, "share": null }),
            )])
            .collect();
        let breakdown = json!({ "attach_modes": { "mode": "lean + sample-hz=999" },
                                "tail": { "threshold_us": 1.0, "parts": parts } });
        let pictures = json!({ "wait": { "holders": [
            { "holder": "other process · kworker/0:1H (pid 54)", "ns": other_ns },
            { "holder": "another request · cpu", "ns": 1000 - other_ns } ] } });
        fs::write(dir.join("breakdown.json"), breakdown.to_string()).unwrap();
        fs::write(dir.join("pictures.json"), pictures.to_string()).unwrap();
    }

    #[test]
    fn a_changed_ranking_and_the_other_processes_share_are_said() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        session(
            a.path(),
            &[
                ("scheduling", 0.52),
                ("ledger_fsync", 0.36),
                ("signing", 0.06),
            ],
            250,
        );
        session(
            b.path(),
            &[
                ("ledger_fsync", 0.58),
                ("scheduling", 0.32),
                ("signing", 0.05),
            ],
            100,
        );
        let then = TailFacts::read(a.path()).unwrap();
        let now = TailFacts::read(b.path()).unwrap();
        assert_eq!(then.other_processes, Some(0.25));
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
