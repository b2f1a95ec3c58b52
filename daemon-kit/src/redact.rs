//! Secrets kept out of what a daemon prints: a Redis URL's password (and
//! the check of a Redis URL's scheme, whose refusal shows the URL).

/// `url` with any password replaced by `***`, for logs, errors and
/// `--print-config`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}")
            } else {
                format!("{scheme}://***@{host}")
            }
        }
        None => url.to_string(),
    }
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
}
