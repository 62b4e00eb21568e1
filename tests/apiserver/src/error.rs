//! Kubernetes `Status` errors returned by the test API server.

use serde_json::{Value, json};

/// The `reason` of a failed request, as kube-apiserver spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// 404.
    NotFound,
    /// 409 on create.
    AlreadyExists,
    /// 409 on a stale write or a failed precondition.
    Conflict,
    /// 422.
    Invalid,
    /// 400.
    BadRequest,
    /// 410 on a plain request.
    Gone,
    /// 410 inside a watch stream ("too old resource version").
    Expired,
    /// 405.
    MethodNotAllowed,
    /// 415.
    UnsupportedMediaType,
    /// 500.
    InternalError,
    /// 503.
    ServiceUnavailable,
    /// 504.
    Timeout,
    /// 429.
    TooManyRequests,
    /// 403.
    Forbidden,
    /// 401.
    Unauthorized,
}

impl Reason {
    /// The reason string of a `Status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotFound => "NotFound",
            Reason::AlreadyExists => "AlreadyExists",
            Reason::Conflict => "Conflict",
            Reason::Invalid => "Invalid",
            Reason::BadRequest => "BadRequest",
            Reason::Gone => "Gone",
            Reason::Expired => "Expired",
            Reason::MethodNotAllowed => "MethodNotAllowed",
            Reason::UnsupportedMediaType => "UnsupportedMediaType",
            Reason::InternalError => "InternalError",
            Reason::ServiceUnavailable => "ServiceUnavailable",
            Reason::Timeout => "Timeout",
            Reason::TooManyRequests => "TooManyRequests",
            Reason::Forbidden => "Forbidden",
            Reason::Unauthorized => "Unauthorized",
        }
    }

    /// The reason kube-apiserver uses for an HTTP status code.
    pub fn for_code(code: u16) -> Reason {
        match code {
            400 => Reason::BadRequest,
            401 => Reason::Unauthorized,
            403 => Reason::Forbidden,
            404 => Reason::NotFound,
            405 => Reason::MethodNotAllowed,
            409 => Reason::Conflict,
            410 => Reason::Gone,
            415 => Reason::UnsupportedMediaType,
            422 => Reason::Invalid,
            429 => Reason::TooManyRequests,
            503 => Reason::ServiceUnavailable,
            504 => Reason::Timeout,
            _ => Reason::InternalError,
        }
    }
}

/// One field-level cause of an `Invalid` error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueNotSupported`, `FieldValueInvalid`, `FieldValueRequired`, ...
    pub reason: &'static str,
    /// The field path, e.g. `spec.positionAdvice`.
    pub field: String,
    /// The full message, which starts with the field path.
    pub message: String,
}

const NO_ROUTE: &str = "the server could not find the requested resource";

/// A failed request: becomes a `Status` body with the matching HTTP code.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {}: {message}", reason.as_str())]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason.
    pub reason: Reason,
    /// Human-readable message.
    pub message: String,
    /// `details`: name, group, kind (kube-apiserver puts the plural here for most errors).
    pub details: Option<Box<(String, String, String)>>,
    /// `details.causes`.
    pub causes: Vec<Cause>,
}

/// What an error is about: group, plural (or kind) and name.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// API group; empty for the core group.
    pub group: &'a str,
    /// Plural resource name.
    pub plural: &'a str,
    /// Object name.
    pub name: &'a str,
}

impl Subject<'_> {
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    fn details(&self) -> Option<Box<(String, String, String)>> {
        Some(Box::new((
            self.name.to_string(),
            self.group.to_string(),
            self.plural.to_string(),
        )))
    }
}

impl ApiError {
    /// An error with a code and message and no details.
    pub fn new(code: u16, reason: Reason, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            causes: Vec::new(),
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, Reason::BadRequest, message)
    }

    /// 404 for a path the server does not serve.
    pub fn no_route() -> Self {
        let mut e = Self::new(404, Reason::NotFound, NO_ROUTE);
        e.details = Some(Box::new((String::new(), String::new(), String::new())));
        e
    }

    /// Whether this is the 404 of [`ApiError::no_route`].
    pub fn is_no_route(&self) -> bool {
        self.code == 404 && self.reason == Reason::NotFound && self.message == NO_ROUTE
    }

    /// 404 for a missing object.
    pub fn not_found(s: Subject<'_>) -> Self {
        let mut e = Self::new(
            404,
            Reason::NotFound,
            format!("{} \"{}\" not found", s.qualified(), s.name),
        );
        e.details = s.details();
        e
    }

    /// 409 AlreadyExists.
    pub fn already_exists(s: Subject<'_>) -> Self {
        let mut e = Self::new(
            409,
            Reason::AlreadyExists,
            format!("{} \"{}\" already exists", s.qualified(), s.name),
        );
        e.details = s.details();
        e
    }

    /// 409 Conflict on a stale resourceVersion.
    pub fn conflict(s: Subject<'_>) -> Self {
        Self::conflict_with(
            s,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 Conflict with a specific explanation.
    pub fn conflict_with(s: Subject<'_>, why: &str) -> Self {
        let mut e = Self::new(
            409,
            Reason::Conflict,
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {why}",
                s.qualified(),
                s.name
            ),
        );
        e.details = s.details();
        e
    }

    /// 409 Conflict on a failed delete precondition; kube-apiserver names the kind here.
    pub fn precondition_failed(kind: &str, group: &str, name: &str, why: &str) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let mut e = Self::new(
            409,
            Reason::Conflict,
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"),
        );
        e.details = Some(Box::new((
            name.to_string(),
            group.to_string(),
            kind.to_string(),
        )));
        e
    }

    /// 422 Invalid: `Kind.group "name" is invalid: cause; cause`.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let list = causes.iter().map(|c| c.message.clone()).collect::<Vec<_>>();
        let text = if list.len() == 1 {
            list.join("")
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut e = Self::new(
            422,
            Reason::Invalid,
            format!("{qualified} \"{name}\" is invalid: {text}"),
        );
        e.details = Some(Box::new((
            name.to_string(),
            group.to_string(),
            kind.to_string(),
        )));
        e.causes = causes;
        e
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            Reason::MethodNotAllowed,
            "the server does not allow this method on the requested resource",
        )
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(accepted: &str) -> Self {
        Self::new(
            415,
            Reason::UnsupportedMediaType,
            format!(
                "the body of the request was in an unknown format - accepted media types include: {accepted}"
            ),
        )
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, Reason::InternalError, message)
    }

    /// The `Status` object sent to the client.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason.as_str(),
            "code": self.code,
        });
        if let Some(d) = &self.details {
            let (name, group, kind) = &**d;
            let mut d = serde_json::Map::new();
            if !name.is_empty() {
                d.insert("name".into(), json!(name));
            }
            if !group.is_empty() {
                d.insert("group".into(), json!(group));
            }
            if !kind.is_empty() {
                d.insert("kind".into(), json!(kind));
            }
            if !self.causes.is_empty() {
                let causes: Vec<Value> = self
                    .causes
                    .iter()
                    .map(|c| {
                        // kube-apiserver's cause message is the error body without the field
                        // path (`field.Error.ErrorBody()`); the field path is in `field`.
                        let body = c
                            .message
                            .strip_prefix(c.field.as_str())
                            .and_then(|m| m.strip_prefix(": "))
                            .unwrap_or(&c.message);
                        json!({"reason": c.reason, "message": body, "field": c.field})
                    })
                    .collect();
                d.insert("causes".into(), Value::Array(causes));
            }
            status["details"] = Value::Object(d);
        }
        status
    }
}
