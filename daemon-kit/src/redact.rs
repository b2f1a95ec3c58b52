//! Secrets kept out of what a daemon prints: a Redis URL's password (and
//! the check of a Redis URL's scheme, whose refusal shows the URL).

/// Query parameters whose value is a secret, compared without case
/// (redis-rs reads `password`/`pass` for `redis+unix://` URLs; the others
/// are what a user might write).
const SECRET_PARAMS: &[&str] = &[
    "password", "pass", "passwd", "pwd", "secret", "token", "auth",
];

/// `url` with every password replaced by `***`, for logs, errors and
/// `--print-config`, in every form a URL can take: a password in the user
/// part (`redis://:pw@h`, `redis://user:pw@h`, `redis://token@h`), one that
/// itself holds `@`, `:` or `/`, a secret query parameter (`?password=`,
/// `&pass=`, ...), each URL of a comma-separated list, and a malformed URL
/// (no `://`, a scheme of one slash): whatever comes before the last `@` of
/// an entry is never shown.
pub fn redact_url(url: &str) -> String {
    url_list(url)
        .iter()
        .map(|entry| redact_one(entry))
        .collect::<Vec<_>>()
        .join(",")
}

/// The URLs of a comma-separated list, as written (not trimmed): each
/// entry begins a URL (`scheme://`), so a piece that does not is part of
/// the entry before it (a password holding a comma).
pub fn url_list(text: &str) -> Vec<String> {
    let mut entries: Vec<String> = Vec::new();
    for piece in text.split(',') {
        match entries.last_mut() {
            Some(last) if !piece.contains("://") => {
                last.push(',');
                last.push_str(piece);
            }
            _ => entries.push(piece.to_string()),
        }
    }
    entries
}

/// One URL of a list, redacted.
fn redact_one(url: &str) -> String {
    // Where the user part may begin: after "scheme://", "scheme:/",
    // "scheme:" or at the start of a malformed URL.
    let start = url
        .find("://")
        .map(|i| i + 3)
        .or_else(|| {
            url.find(':')
                .filter(|&i| {
                    url[..i]
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                })
                .map(|i| i + 1 + url[i + 1..].chars().take_while(|&c| c == '/').count())
        })
        .unwrap_or(0);
    let (scheme, rest) = url.split_at(start);
    // The query's secrets go whatever the rest is.
    let (rest, query) = match rest.find('?') {
        // A '?' after the last '@' starts the query; one before it may be
        // part of a password.
        Some(q) if rest.rfind('@').is_none_or(|at| q > at) => (&rest[..q], Some(&rest[q + 1..])),
        _ => (rest, None),
    };
    let mut out = scheme.to_string();
    match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            match userinfo.split_once(':') {
                Some((user, _)) if !user.contains('/') => {
                    out.push_str(user);
                    out.push_str(":***@");
                }
                _ => out.push_str("***@"),
            }
            out.push_str(&rest[at + 1..]);
        }
        None => out.push_str(rest),
    }
    if let Some(query) = query {
        out.push('?');
        let params: Vec<String> = query
            .split('&')
            .map(|param| match param.split_once('=') {
                Some((key, _))
                    if SECRET_PARAMS
                        .iter()
                        .any(|secret| key.eq_ignore_ascii_case(secret)) =>
                {
                    format!("{key}=***")
                }
                _ => param.to_string(),
            })
            .collect();
        out.push_str(&params.join("&"));
    }
    out
}

/// Why `url` cannot be a Redis URL (the scheme is not `redis://` or
/// `rediss://`), with the URL shown redacted; `None` when it can.
pub fn redis_url_problem(url: &str) -> Option<String> {
    (!(url.starts_with("redis://") || url.starts_with("rediss://")))
        .then(|| format!("{} is not a redis:// or rediss:// URL", redact_url(url)))
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("redis://:s3cret@h:6379/0"),
            "redis://:***@h:6379/0"
        );
        assert_eq!(
            redact_url("rediss://user:pw@h:6380"),
            "rediss://user:***@h:6380"
        );
        assert_eq!(redact_url("redis://token@h"), "redis://***@h");
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }

    /// Every form the outside probe and its next variants try: no form
    /// shows the secret.
    #[test]
    fn every_form_of_a_url_keeps_its_secret() {
        let secret = "Zq9";
        for (url, shown) in [
            (
                "redis://:Zq9secret@a:1,redis://:Zq9secret@b:2",
                "redis://:***@a:1,redis://:***@b:2",
            ),
            (
                "redis://a:1, redis://u:Zq9secret@b:2",
                "redis://a:1, redis://u:***@b:2",
            ),
            (
                "redis://h:6379/0?password=Zq9secret",
                "redis://h:6379/0?password=***",
            ),
            (
                "redis://h:6379?db=1&PASS=Zq9secret&protocol=resp3",
                "redis://h:6379?db=1&PASS=***&protocol=resp3",
            ),
            (
                "redis+unix:///run/redis.sock?pass=Zq9secret",
                "redis+unix:///run/redis.sock?pass=***",
            ),
            ("redis//:Zq9secret@h:6379", "***@h:6379"),
            ("redis:/:Zq9secret@h:6379", "redis:/:***@h:6379"),
            ("redis:Zq9secret@h", "redis:***@h"),
            (":Zq9secret@h:6379", ":***@h:6379"),
            ("redis://:p@ss@Zq9secret@h", "redis://:***@h"),
            ("redis://:Zq9secret/x@h", "redis://:***@h"),
            ("redis://:Zq9?secret@h", "redis://:***@h"),
            ("http://u:Zq9secret@h", "http://u:***@h"),
            (
                "redis://:Zq9,secret@h,redis://b",
                "redis://:***@h,redis://b",
            ),
        ] {
            let got = redact_url(url);
            assert!(!got.contains(secret), "{url} shown as {got}");
            assert_eq!(got, shown, "{url}");
        }
    }
}
