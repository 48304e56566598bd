//! API errors: every one is `{"error": "<message>", "code": "<code>"}` with an HTTP status.

use std::borrow::Cow;

use hyper::StatusCode;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: Cow<'static, str>,
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn unauthorized(message: &'static str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn bad_request(code: &'static str, message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn internal(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    pub fn body(&self) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Body<'a> {
            error: &'a str,
            code: &'a str,
        }
        serde_json::to_vec(&Body {
            error: &self.message,
            code: self.code,
        })
        .unwrap_or_default()
    }
}
