//! Passwords out of text that goes to logs and errors: [`redact_url_passwords`]. A leaf
//! room: the config parser (its YAML messages quote bad values) and the error type (a
//! config error's field and reason) both use it, and it knows neither.

/// `text` with the password of every `scheme://user:password@host` in it replaced by
/// `<redacted>`. The YAML parser quotes a value of the wrong type in its message
/// (`invalid type: string "postgres://u:pw@db/m", expected struct MetaSyncConfig`), and
/// that message goes to the log.
pub fn redact_url_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#' | '"' | '\'' | '`') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority
            .rfind('@')
            .map(|at| (&authority[..at], &authority[at..]))
        {
            Some((userinfo, host)) if userinfo.contains(':') => {
                let user = userinfo.split(':').next().unwrap_or_default();
                out.push_str(user);
                out.push_str(":<redacted>");
                out.push_str(host);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}
