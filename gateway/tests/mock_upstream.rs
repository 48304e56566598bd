mod common;

use common::{http, mock_upstream};

#[test]
fn echoes_json_body_and_path() {
    let upstream = mock_upstream(0);
    let reply = http(&upstream.addr, "POST", "/echo", &[], br#"{"a":[1,2]}"#);
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.json(),
        serde_json::json!({"echo": {"a": [1, 2]}, "path": "/echo", "authorization": null})
    );
}

#[test]
fn non_json_body_echoes_null() {
    let upstream = mock_upstream(1);
    let reply = http(&upstream.addr, "GET", "/x/y", &[], b"");
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.json(),
        serde_json::json!({"echo": null, "path": "/x/y", "authorization": null})
    );
}
