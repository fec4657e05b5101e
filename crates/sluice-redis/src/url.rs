//! The Redis URLs every Redis setting of sluice accepts, read into what to connect to.
//!
//! * `redis://[user:password@]host:port[/db]` (and the other forms the `redis` crate reads:
//!   `rediss://`, `unix://`): one server;
//! * `redis+sentinel://[user:password@]host:port[,host:port…]/service[/db]`: the master that the
//!   Sentinels name for `service`, asked again after a failover; the user and password are the
//!   master's (Sentinels without a password, as Redis ships them);
//! * `redis+cluster://[user:password@]host:port[,host:port…]`: a Redis Cluster, found from any
//!   of the nodes given.

/// What a Redis URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spec {
    /// One server, as the `redis` crate reads the URL.
    Single(String),
    /// A Sentinel-managed master.
    Sentinel {
        /// The Sentinels, `host:port` each.
        sentinels: Vec<String>,
        /// The master's name in the Sentinels' configuration.
        service: String,
        /// The master's database.
        db: i64,
        /// The master's user, if any.
        username: Option<String>,
        /// The master's password, if any.
        password: Option<String>,
    },
    /// A Redis Cluster.
    Cluster {
        /// Seed nodes, `redis://[user:password@]host:port` each.
        nodes: Vec<String>,
    },
}

/// Reads a Redis URL; the error says what is wrong with it, never the password.
pub fn parse(url: &str) -> Result<Spec, String> {
    if let Some(rest) = url.strip_prefix("redis+sentinel://") {
        let (auth, rest) = split_auth(rest);
        let (hosts, path) = rest.split_once('/').ok_or("redis+sentinel:// needs /SERVICE after the Sentinels")?;
        let sentinels = hosts_of(hosts)?;
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let service = parts.next().ok_or("redis+sentinel:// needs /SERVICE after the Sentinels")?.to_owned();
        let db = match parts.next() {
            Some(db) => db.parse().map_err(|_| format!("redis+sentinel://: database {db:?} is not a number"))?,
            None => 0,
        };
        if parts.next().is_some() {
            return Err("redis+sentinel://: expected /SERVICE[/DB] after the Sentinels".into());
        }
        let (username, password) = credentials(auth);
        return Ok(Spec::Sentinel { sentinels, service, db, username, password });
    }
    if let Some(rest) = url.strip_prefix("redis+cluster://") {
        let (auth, rest) = split_auth(rest);
        let hosts = rest.trim_end_matches('/');
        if hosts.contains('/') {
            return Err("redis+cluster://: a Redis Cluster has no database to name".into());
        }
        let prefix = auth.map_or_else(String::new, |a| format!("{a}@"));
        let nodes = hosts_of(hosts)?.into_iter().map(|h| format!("redis://{prefix}{h}")).collect();
        return Ok(Spec::Cluster { nodes });
    }
    Ok(Spec::Single(url.to_owned()))
}

/// `user:password@rest` into its two parts (no `@` before the first `/`: no credentials).
fn split_auth(rest: &str) -> (Option<&str>, &str) {
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    }
}

fn credentials(auth: Option<&str>) -> (Option<String>, Option<String>) {
    match auth.map(|a| a.split_once(':').unwrap_or((a, ""))) {
        None => (None, None),
        Some((user, password)) => {
            let user = (!user.is_empty()).then(|| user.to_owned());
            let password = (!password.is_empty()).then(|| password.to_owned());
            (user, password)
        }
    }
}

/// `host:port,host:port` into its hosts, each with a port.
fn hosts_of(hosts: &str) -> Result<Vec<String>, String> {
    let list: Vec<String> = hosts.split(',').filter(|h| !h.is_empty()).map(str::to_owned).collect();
    if list.is_empty() {
        return Err("no host:port given".into());
    }
    for host in &list {
        let port = host.rsplit_once(':').map(|(_, p)| p);
        if port.and_then(|p| p.parse::<u16>().ok()).is_none() {
            return Err(format!("{host:?} needs a port (host:port)"));
        }
    }
    Ok(list)
}

/// The URL without its password, for logs and errors.
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    match split_auth(rest) {
        (Some(auth), rest) => {
            let user = auth.split_once(':').map_or(auth, |(u, _)| u);
            format!("{scheme}://{user}:***@{rest}")
        }
        (None, _) => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_name_the_sentinels_the_service_and_the_masters_database() {
        assert_eq!(
            parse("redis+sentinel://:secret@127.0.0.1:26379,127.0.0.1:26380/mymaster/2"),
            Ok(Spec::Sentinel {
                sentinels: vec!["127.0.0.1:26379".into(), "127.0.0.1:26380".into()],
                service: "mymaster".into(),
                db: 2,
                username: None,
                password: Some("secret".into()),
            })
        );
        let Ok(Spec::Sentinel { db, username, .. }) = parse("redis+sentinel://app@[::1]:26379/m") else {
            panic!("an IPv6 Sentinel")
        };
        assert_eq!((db, username.as_deref()), (0, Some("app")));
        assert!(parse("redis+sentinel://127.0.0.1:26379").unwrap_err().contains("SERVICE"));
        assert!(parse("redis+sentinel://127.0.0.1/m").unwrap_err().contains("port"));
        assert!(parse("redis+sentinel://127.0.0.1:1/m/x").unwrap_err().contains("not a number"));
    }

    #[test]
    fn cluster_urls_list_seed_nodes_with_their_credentials() {
        assert_eq!(
            parse("redis+cluster://u:p@10.0.0.1:7000,10.0.0.2:7001/"),
            Ok(Spec::Cluster { nodes: vec!["redis://u:p@10.0.0.1:7000".into(), "redis://u:p@10.0.0.2:7001".into()] })
        );
        assert!(parse("redis+cluster://10.0.0.1:7000/3").unwrap_err().contains("no database"));
        assert!(parse("redis+cluster://").unwrap_err().contains("no host"));
    }

    #[test]
    fn other_urls_are_the_redis_crates_and_passwords_never_shown() {
        assert_eq!(parse("redis://127.0.0.1:6379/1"), Ok(Spec::Single("redis://127.0.0.1:6379/1".into())));
        assert_eq!(redacted("redis+sentinel://:pw@h:1/m"), "redis+sentinel://:***@h:1/m");
        assert_eq!(redacted("redis://user:pw@h:1"), "redis://user:***@h:1");
        assert_eq!(redacted("redis://h:1"), "redis://h:1");
    }
}
