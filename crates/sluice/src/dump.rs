//! `sluice config dump`: the effective configuration after every layer (defaults, file,
//! environment, flags), with secrets redacted, as TOML. Pure apart from the caller's load.
//!
//! Redacted: API keys (the names of `[access.keys]`, shown as their public id), every field
//! named `secret`, `token` or `password`, and in any URL the user and password, the query,
//! and path segments long enough to be a provider's key (`/v3/<key>`).

use serde_json::Value;

/// What stands in for a secret.
pub const REDACTED: &str = "<redacted>";

/// Path segments this long (letters, digits, `-`, `_`) are taken for keys.
const KEY_LIKE: usize = 20;

/// The configuration as TOML, secrets redacted.
pub fn render(config: &crate::config::Config) -> anyhow::Result<String> {
    let mut value = serde_json::to_value(config)?;
    redact(&mut value, &[]);
    strip_nulls(&mut value);
    Ok(toml::to_string_pretty(&value)?)
}

/// Redacts `value` in place; `path` is where it sits (object keys from the top).
pub fn redact(value: &mut Value, path: &[&str]) {
    match value {
        Value::Object(map) => {
            if path == ["access", "keys"] {
                let entries = std::mem::take(map);
                for (key, entry) in entries {
                    let id = sluice_access::keys::key_id(&sluice_access::keys::hash_key(&key));
                    map.insert(format!("{REDACTED} id {id}"), entry);
                }
            }
            for (name, child) in map.iter_mut() {
                if matches!(name.as_str(), "secret" | "token" | "password") && !child.is_null() {
                    *child = Value::String(REDACTED.into());
                    continue;
                }
                let mut deeper = path.to_vec();
                deeper.push(name);
                redact(child, &deeper);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| redact(item, path)),
        Value::String(text) => {
            if let Some(clean) = redact_url(text) {
                *text = clean;
            }
        }
        _ => {}
    }
}

/// `text` without its credentials, if it is a URL that carries any.
fn redact_url(text: &str) -> Option<String> {
    let mut url = url::Url::parse(text).ok()?;
    if url.cannot_be_a_base() {
        return None;
    }
    let mut changed = false;
    if !url.username().is_empty() {
        changed |= url.set_username(REDACTED).is_ok();
    }
    if url.password().is_some() {
        changed |= url.set_password(Some(REDACTED)).is_ok();
    }
    if url.query().is_some() {
        url.set_query(Some(REDACTED));
        changed = true;
    }
    // A URL without a path (`redis://host:6379`) has no segments.
    let segments: Vec<String> = url.path_segments().map(|s| s.map(str::to_owned).collect()).unwrap_or_default();
    let key_like =
        |s: &str| s.len() >= KEY_LIKE && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if segments.iter().any(|s| key_like(s)) {
        let path: Vec<&str> = segments.iter().map(|s| if key_like(s) { REDACTED } else { s.as_str() }).collect();
        url.set_path(&path.join("/"));
        changed = true;
    }
    changed.then(|| url.to_string().replace("%3Credacted%3E", REDACTED))
}

/// TOML has no null: absent settings are left out.
fn strip_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keys_secrets_and_url_credentials_are_redacted() {
        let mut config = json!({
            "upstreams": [{"url": "https://user:pa55@node.example/v3/0123456789abcdef0123456789abcdef?apikey=zzz"}],
            "access": {
                "keys": {"sk_live_secret_key_1": "free"},
                "jwt": {"keys": [{"kid": "a", "secret": "hunter2hunter2hunter2"}]},
                "admin": {"token": "admin-token-0123456789", "listen": "127.0.0.1:8546"},
                "redis_url": "redis://:hunter2@127.0.0.1:6379"
            },
            "listen": "127.0.0.1:8545",
            "cache": {"redis": {"url": "redis://127.0.0.1:6379"}}
        });
        redact(&mut config, &[]);
        let text = config.to_string();
        for secret in ["pa55", "user", "0123456789abcdef0123456789abcdef", "zzz", "sk_live", "hunter2", "admin-token"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(
            config["upstreams"][0]["url"],
            "https://<redacted>:<redacted>@node.example/v3/<redacted>?<redacted>"
        );
        assert_eq!(config["access"]["admin"]["listen"], "127.0.0.1:8546");
        assert_eq!(config["cache"]["redis"]["url"], "redis://127.0.0.1:6379", "nothing to hide, unchanged");
        let id = sluice_access::keys::key_id(&sluice_access::keys::hash_key("sk_live_secret_key_1"));
        assert_eq!(config["access"]["keys"][format!("<redacted> id {id}")], "free");
    }
}
