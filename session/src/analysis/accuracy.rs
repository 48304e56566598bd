//! Accuracy against the client: join the tracer's `requests.csv` (and `incomplete.csv`) with
//! loadgen's `--requests-out` by request id. Both sides stamp CLOCK_MONOTONIC, so for every
//! request the client's send precedes the kernel's arrival, and the tracer's `t_done` (the
//! entry of the response write) precedes the client's receive. `client latency − tracer total`
//! (latency = received − sent, not from the scheduled time) is then the loopback and client
//! stack time, and is never negative unless the tracer is wrong.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::dist::{Dist, DistUs};
use crate::requests::IncompleteRow;

/// One row of loadgen's per-request CSV.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct ClientRow {
    pub request_id: u64,
    pub sent_ns: u64,
    pub received_ns: u64,
    /// HTTP status; 0 for a transport error or timeout (no response).
    pub status: u16,
}

/// What the join needs of one complete request in the tracer's `requests.csv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct TracedRow {
    pub request_id: u64,
    pub status: u16,
    pub t_arrive_ns: u64,
    pub t_done_ns: u64,
}

/// The rows of a CSV with a header line, by column name (other columns are ignored); `what`
/// names the file in errors, which say the line.
fn read_rows<T: DeserializeOwned>(input: impl Read, what: &str) -> Result<Vec<T>> {
    let mut reader = csv::Reader::from_reader(input);
    let header = reader
        .headers()
        .with_context(|| format!("reading {what}"))?
        .clone();
    if header.is_empty() {
        bail!("{what}: empty file");
    }
    reader
        .deserialize()
        .map(|row| {
            row.map_err(|e| {
                // csv names a bad field by its index only.
                let column = match e.kind() {
                    csv::ErrorKind::Deserialize { err, .. } => {
                        err.field().and_then(|i| header.get(i as usize))
                    }
                    _ => None,
                };
                let context = match column {
                    Some(column) => format!("reading {what}, column {column}"),
                    None => format!("reading {what}"),
                };
                anyhow::Error::new(e).context(context)
            })
        })
        .collect()
}

/// loadgen `--requests-out`: request_id, scheduled_ns, sent_ns, received_ns, status, ...
pub fn read_client_csv(input: impl Read) -> Result<Vec<ClientRow>> {
    read_rows(input, "loadgen requests CSV")
}

/// The tracer's `requests.csv`.
pub fn read_traced_csv(input: impl Read) -> Result<Vec<TracedRow>> {
    read_rows(input, "tracer requests.csv")
}

/// The tracer's `incomplete.csv`.
pub fn read_incomplete_csv(input: impl Read) -> Result<Vec<IncompleteRow>> {
    read_rows(input, "tracer incomplete.csv")
}

/// How many offending request ids to keep as examples.
const EXAMPLES: usize = 10;

/// The join, as validation.json holds it (`accuracy.join`, and each loss run's `accuracy`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Accuracy {
    /// Requests answered (status ≠ 0) on the client and complete in the tracer.
    pub matched: u64,
    /// `(received − sent) − (t_done − t_arrive)` over matched requests.
    pub client_minus_tracer: DistUs,
    /// Matched requests whose gap is negative.
    pub negative: u64,
    /// Matched requests whose gap is negative, first few ids.
    pub negative_ids: Vec<u64>,
    /// `t_arrive < sent`: the tracer saw the request arrive before the client sent it.
    pub arrive_before_sent: u64,
    /// `t_done > received`: the tracer's response write began after the client had it.
    pub done_after_received: u64,
    /// Matched requests whose HTTP status differs between the two sides.
    pub status_mismatch: u64,
    /// Client rows without a response (transport error, timeout): nothing to trace.
    pub client_unanswered: u64,
    /// Answered on the client, not complete in the tracer.
    pub client_only: u64,
    /// The same, by client status.
    pub client_only_by_status: BTreeMap<u16, u64>,
    /// Of those, listed in the tracer's incomplete.csv, by reason.
    pub client_only_incomplete: BTreeMap<String, u64>,
    /// 200 responses on the client that the tracer did not report complete.
    pub untraced_ok: u64,
    /// Answered with 200 on the client, not complete in the tracer: first few ids.
    pub untraced_ok_ids: Vec<u64>,
    /// Complete in the tracer with an id the client never sent (or got no answer for).
    pub tracer_only: u64,
    /// Listed incomplete by the tracer, for ids the client sent.
    pub incomplete_of_client: u64,
}

fn keep(ids: &mut Vec<u64>, id: u64) {
    if ids.len() < EXAMPLES {
        ids.push(id);
    }
}

/// Joins by request id. Output order never depends on hashing: counts and sorted examples.
pub fn join(client: &[ClientRow], traced: &[TracedRow], incomplete: &[IncompleteRow]) -> Accuracy {
    let mut acc = Accuracy::default();
    let traced_by_id: HashMap<u64, &TracedRow> = traced.iter().map(|r| (r.request_id, r)).collect();
    let incomplete_by_id: HashMap<u64, &str> = incomplete
        .iter()
        .map(|row| (row.request_id, row.reason.as_str()))
        .collect();
    let mut answered: Vec<&ClientRow> = Vec::with_capacity(client.len());
    let mut gaps = Vec::with_capacity(traced.len());
    for c in client {
        if incomplete_by_id.contains_key(&c.request_id) {
            acc.incomplete_of_client += 1;
        }
        if c.status == 0 {
            acc.client_unanswered += 1;
        } else {
            answered.push(c);
        }
    }
    answered.sort_unstable_by_key(|c| c.request_id);
    let mut answered_ids = HashSet::with_capacity(answered.len());
    for c in answered {
        answered_ids.insert(c.request_id);
        let Some(t) = traced_by_id.get(&c.request_id) else {
            *acc.client_only_by_status.entry(c.status).or_default() += 1;
            if let Some(reason) = incomplete_by_id.get(&c.request_id) {
                *acc.client_only_incomplete
                    .entry((*reason).to_owned())
                    .or_default() += 1;
            }
            if c.status == 200 {
                keep(&mut acc.untraced_ok_ids, c.request_id);
            }
            continue;
        };
        acc.matched += 1;
        let client_ns = i128::from(c.received_ns) - i128::from(c.sent_ns);
        let tracer_ns = i128::from(t.t_done_ns) - i128::from(t.t_arrive_ns);
        let gap = (client_ns - tracer_ns).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        if gap < 0 {
            keep(&mut acc.negative_ids, c.request_id);
        }
        gaps.push(gap);
        acc.arrive_before_sent += u64::from(t.t_arrive_ns < c.sent_ns);
        acc.done_after_received += u64::from(t.t_done_ns > c.received_ns);
        acc.status_mismatch += u64::from(t.status != c.status);
    }
    acc.tracer_only = traced
        .iter()
        .filter(|t| !answered_ids.contains(&t.request_id))
        .count() as u64;
    let gap = Dist::of(gaps);
    acc.client_minus_tracer = gap.to_us();
    acc.negative = gap.negative;
    acc.client_only = acc.client_only_by_status.values().sum();
    acc.untraced_ok = acc.client_only_by_status.get(&200).copied().unwrap_or(0);
    acc
}

fn open(path: &Path) -> Result<File> {
    File::open(path).with_context(|| format!("opening {}", path.display()))
}

/// [`join`] of loadgen's `--requests-out` CSV with a session's requests.csv and incomplete.csv.
pub fn join_files(client: &Path, requests: &Path, incomplete: &Path) -> Result<Accuracy> {
    let client_rows = read_client_csv(open(client)?)?;
    let traced = read_traced_csv(open(requests)?)?;
    let incomplete = read_incomplete_csv(open(incomplete)?)?;
    Ok(join(&client_rows, &traced, &incomplete))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(id: u64, sent: u64, received: u64, status: u16) -> ClientRow {
        ClientRow {
            request_id: id,
            sent_ns: sent,
            received_ns: received,
            status,
        }
    }

    fn traced(id: u64, arrive: u64, done: u64) -> TracedRow {
        TracedRow {
            request_id: id,
            status: 200,
            t_arrive_ns: arrive,
            t_done_ns: done,
        }
    }

    fn incomplete(id: u64, reason: &str) -> IncompleteRow {
        IncompleteRow {
            request_id: id,
            reason: reason.to_owned(),
        }
    }

    #[test]
    fn reads_both_csvs_by_column_name() {
        let c = "request_id,scheduled_ns,sent_ns,received_ns,status,error,warmup\n\
                 7,90,100,900,200,,0\n8,95,110,0,0,timeout,1\n";
        assert_eq!(
            read_client_csv(c.as_bytes()).unwrap(),
            vec![client(7, 100, 900, 200), client(8, 110, 0, 0)]
        );
        let t = "request_id,status,t_arrive_ns,t_done_ns,total_ns,overhead_ns,upstream_ns\n\
                 7,200,120,800,680,600,80\n";
        assert_eq!(
            read_traced_csv(t.as_bytes()).unwrap(),
            vec![traced(7, 120, 800)]
        );
        let i = "request_id,reason\n9,events lost\n";
        assert_eq!(
            read_incomplete_csv(i.as_bytes()).unwrap(),
            vec![incomplete(9, "events lost")]
        );
    }

    #[test]
    fn bad_csvs_say_where() {
        let missing = "request_id,sent_ns,status\n1,2,200\n";
        let err = format!("{:#}", read_client_csv(missing.as_bytes()).unwrap_err());
        assert!(err.contains("received_ns"), "{err}");
        let garbled = "request_id,sent_ns,received_ns,status\n1,2,x,200\n";
        let err = format!("{:#}", read_client_csv(garbled.as_bytes()).unwrap_err());
        assert!(
            err.contains("line: 2") && err.contains("received_ns"),
            "{err}"
        );
        let short = "request_id,sent_ns,received_ns,status\n1,2\n";
        assert!(read_client_csv(short.as_bytes()).is_err());
        assert!(read_traced_csv(&b""[..]).is_err());
    }

    #[test]
    fn joins_gaps_and_both_sides_leftovers() {
        let clients = [
            client(1, 100, 1_000, 200), // traced 150..900: gap 900 − 750 = 150
            client(2, 100, 1_000, 200), // traced 50..1100: before sent, after received, negative
            client(3, 100, 1_000, 200), // incomplete in the tracer
            client(4, 100, 1_000, 503), // untraced, not a 200
            client(5, 100, 0, 0),       // timeout: nothing to trace
            client(6, 100, 1_000, 200), // not seen at all
        ];
        let traced_rows = [traced(1, 150, 900), traced(2, 50, 1_100), traced(99, 1, 2)];
        let acc = join(&clients, &traced_rows, &[incomplete(3, "events lost")]);
        assert_eq!(acc.matched, 2);
        let gap = acc.client_minus_tracer;
        assert_eq!((gap.min_us, gap.max_us), (-0.15, 0.15));
        assert_eq!((acc.negative, acc.negative_ids.clone()), (1, vec![2]));
        assert_eq!((acc.arrive_before_sent, acc.done_after_received), (1, 1));
        assert_eq!(acc.client_unanswered, 1);
        assert_eq!(acc.untraced_ok, 2);
        assert_eq!(acc.untraced_ok_ids, vec![3, 6]);
        assert_eq!(acc.client_only, 3);
        assert_eq!(acc.client_only_incomplete.get("events lost"), Some(&1));
        assert_eq!((acc.tracer_only, acc.incomplete_of_client), (1, 1));
        assert_eq!(acc.status_mismatch, 0);
        let v = serde_json::to_value(&acc).unwrap();
        assert_eq!(v["client_only_by_status"]["503"], 1);
        assert_eq!(v["client_minus_tracer"]["negative"], 1);
        assert_eq!(serde_json::from_value::<Accuracy>(v).unwrap(), acc);
    }
}
