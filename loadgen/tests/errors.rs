//! Bad flags and an unreachable URL end with a clear message and a failing exit code.

#[expect(dead_code, reason = "this test uses only part of the shared helpers")]
mod common;

use common::loadgen;

fn stderr_of(args: &[&str]) -> String {
    testproc::failed_stderr(&loadgen(args))
}

#[test]
fn bad_flags_are_refused_with_the_reason() {
    let url = "http://127.0.0.1:9";
    let cases: &[(&[&str], &str)] = &[
        (
            &["--url", url, "--direct", "--rate", "abc"],
            "not a positive number",
        ),
        (
            &["--url", url, "--direct", "--rate", "0"],
            "not a positive number",
        ),
        (
            &["--url", url, "--direct", "--rate=-5"],
            "not a positive number",
        ),
        (&["--url", url, "--direct"], "--rate"),
        (
            &[
                "--url",
                url,
                "--direct",
                "--rate",
                "5",
                "--concurrency",
                "2",
            ],
            "cannot be used with",
        ),
        (&["--url", url, "--direct", "--concurrency", "0"], "0"),
        (
            &[
                "--url",
                url,
                "--direct",
                "--rate",
                "5",
                "--duration",
                "forever",
            ],
            "not a positive number",
        ),
        (&["--url", url, "--rate", "5"], "--key is required"),
        (
            &["--url", "127.0.0.1:9", "--direct", "--rate", "5"],
            "no scheme",
        ),
        (
            &["--url", "https://127.0.0.1:9", "--direct", "--rate", "5"],
            "only http",
        ),
        (&["--rate", "5"], "--url"),
    ];
    for (args, expected) in cases {
        let stderr = stderr_of(args);
        assert!(
            stderr.contains(expected),
            "loadgen {args:?}: expected {expected:?} in {stderr:?}"
        );
    }
}

#[test]
fn unreachable_url_fails_before_the_run() {
    // A port that was just free: nothing listens on it.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("run.json");
    let started = std::time::Instant::now();
    let stderr = stderr_of(&[
        "--url",
        &url,
        "--direct",
        "--rate",
        "100",
        "--duration",
        "30",
        "--out",
        json.to_str().unwrap(),
    ]);
    assert!(stderr.contains("cannot connect to"), "{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
    assert!(!json.exists(), "no summary for a run that never started");
    // It gave up at the connectivity check, not after the 30 s run.
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}
