//! The method mix: which calls to make, with which params, how often. Pure.
//!
//! A mix file (TOML):
//!
//! ```toml
//! [vars]
//! address = ["0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266", "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"]
//! block = { from = 0, to = 100 }        # a random height in the range, as a hex quantity
//! anyone = { random = 20 }               # 20 random bytes, as 0x hex: an address never asked before
//!
//! [[call]]
//! method = "eth_getBalance"
//! params = ["{address}", "latest"]
//! weight = 20
//!
//! [[call]]
//! method = "eth_getBlockByNumber"
//! params = ["{block}", false]
//! weight = 10
//! ```
//!
//! A string param that is exactly `{name}` is replaced by a draw from `vars.name`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// A parsed mix.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mix {
    /// Template variables.
    #[serde(default)]
    pub vars: BTreeMap<String, Var>,
    /// The calls and their weights.
    #[serde(rename = "call")]
    pub calls: Vec<Call>,
}

/// One call template.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Call {
    /// The method.
    pub method: String,
    /// Params; strings `{name}` are filled from the vars.
    #[serde(default)]
    pub params: Vec<toml::Value>,
    /// Relative weight (default 1).
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// A template variable: a list to draw from, or a range of heights.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub enum Var {
    /// One of these strings.
    List(Vec<String>),
    /// A random height in `from..=to`, as a hex quantity.
    Range {
        /// Lowest.
        from: u64,
        /// Highest.
        to: u64,
    },
    /// This many random bytes, as `0x` hex (20: an address; 32: a slot or a hash): calls that
    /// are all distinct, as a soak of cache misses needs.
    Random {
        /// How many bytes.
        random: usize,
    },
}

impl Mix {
    /// Parses and checks a mix file's text.
    pub fn parse(text: &str) -> Result<Mix, String> {
        let mix: Mix = toml::from_str(text).map_err(|e| format!("method mix: {e}"))?;
        if mix.calls.is_empty() {
            return Err("method mix: no [[call]] entries".into());
        }
        if mix.calls.iter().all(|c| c.weight == 0) {
            return Err("method mix: every weight is zero".into());
        }
        for call in &mix.calls {
            let mut names = Vec::new();
            call.params.iter().for_each(|p| placeholders(p, &mut names));
            for name in names {
                if !mix.vars.contains_key(name) {
                    return Err(format!("method mix: {} uses {{{name}}}, but [vars] has no {name}", call.method));
                }
            }
        }
        for (name, var) in &mix.vars {
            match var {
                Var::List(items) if items.is_empty() => return Err(format!("method mix: vars.{name} is empty")),
                Var::Range { from, to } if from > to => return Err(format!("method mix: vars.{name} has from > to")),
                Var::Random { random } if !(1..=64).contains(random) => {
                    return Err(format!("method mix: vars.{name}: random takes 1 to 64 bytes"))
                }
                _ => {}
            }
        }
        Ok(mix)
    }

    /// One method with fixed params (`--method` and `--params`).
    pub fn single(method: &str, params: &str) -> Result<Mix, String> {
        let params: Value = serde_json::from_str(params).map_err(|e| format!("--params: {e}"))?;
        let Value::Array(params) = params else { return Err("--params must be a JSON array".into()) };
        let params = params
            .into_iter()
            .map(|v| toml::Value::try_from(v).map_err(|e| format!("--params: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(Mix { vars: BTreeMap::new(), calls: vec![Call { method: method.to_owned(), params, weight: 1 }] })
    }

    /// Draws one call: the method and its params as JSON text.
    pub fn draw(&self, rng: &mut fastrand::Rng) -> (&str, String) {
        let total: u64 = self.calls.iter().map(|c| u64::from(c.weight)).sum();
        let mut pick = rng.u64(0..total);
        let call = self
            .calls
            .iter()
            .find(|c| {
                if pick < u64::from(c.weight) {
                    true
                } else {
                    pick -= u64::from(c.weight);
                    false
                }
            })
            .unwrap_or(&self.calls[0]);
        let params: Vec<Value> = call.params.iter().map(|p| self.fill(p, rng)).collect();
        (&call.method, Value::Array(params).to_string())
    }

    /// Fills `{name}` strings anywhere in a param (inside objects and arrays too).
    fn fill(&self, param: &toml::Value, rng: &mut fastrand::Rng) -> Value {
        if let Some(var) = placeholder(param).and_then(|name| self.vars.get(name)) {
            return match var {
                Var::List(items) => Value::String(items[rng.usize(0..items.len())].clone()),
                Var::Range { from, to } => Value::String(format!("0x{:x}", rng.u64(*from..=*to))),
                Var::Random { random } => {
                    let mut hex = String::with_capacity(2 + 2 * random);
                    hex.push_str("0x");
                    for _ in 0..*random {
                        hex.push_str(&format!("{:02x}", rng.u8(..)));
                    }
                    Value::String(hex)
                }
            };
        }
        match param {
            toml::Value::Array(items) => Value::Array(items.iter().map(|p| self.fill(p, rng)).collect()),
            toml::Value::Table(table) => {
                Value::Object(table.iter().map(|(k, v)| (k.clone(), self.fill(v, rng))).collect())
            }
            other => serde_json::to_value(other).unwrap_or(Value::Null),
        }
    }
}

fn placeholder(v: &toml::Value) -> Option<&str> {
    v.as_str()?.strip_prefix('{')?.strip_suffix('}')
}

/// Every `{name}` in a param, nested ones included.
fn placeholders<'a>(v: &'a toml::Value, out: &mut Vec<&'a str>) {
    match v {
        toml::Value::Array(items) => items.iter().for_each(|i| placeholders(i, out)),
        toml::Value::Table(table) => table.values().for_each(|i| placeholders(i, out)),
        other => out.extend(placeholder(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIX: &str = r#"
        [vars]
        address = ["0xaa", "0xbb"]
        block = { from = 5, to = 6 }
        [[call]]
        method = "eth_getBalance"
        params = ["{address}", "latest"]
        weight = 3
        [[call]]
        method = "eth_getBlockByNumber"
        params = ["{block}", false]
        weight = 1
    "#;

    #[test]
    fn draws_follow_the_weights_and_fill_the_templates() {
        let mix = Mix::parse(MIX).unwrap();
        let mut rng = fastrand::Rng::with_seed(7);
        let mut balances = 0;
        for _ in 0..4000 {
            let (method, params) = mix.draw(&mut rng);
            if method == "eth_getBalance" {
                balances += 1;
                assert!(params == r#"["0xaa","latest"]"# || params == r#"["0xbb","latest"]"#, "{params}");
            } else {
                assert!(params == r#"["0x5",false]"# || params == r#"["0x6",false]"#, "{params}");
            }
        }
        assert!((2800..3200).contains(&balances), "{balances}");
    }

    #[test]
    fn templates_fill_inside_objects_and_arrays() {
        let mix = Mix::parse(
            "[vars]\nto = [\"0xcc\"]\n[[call]]\nmethod = \"eth_call\"\nparams = [{ to = \"{to}\", data = \"0x1\" }, [\"{to}\"]]",
        )
        .unwrap();
        let (_, params) = mix.draw(&mut fastrand::Rng::with_seed(1));
        assert_eq!(params, r#"[{"data":"0x1","to":"0xcc"},["0xcc"]]"#);
        let missing = Mix::parse("[[call]]\nmethod = \"m\"\nparams = [{ to = \"{nobody}\" }]").unwrap_err();
        assert!(missing.contains("{nobody}"), "{missing}");
    }

    #[test]
    fn random_bytes_make_every_call_distinct() {
        let mix = Mix::parse(
            "[vars]\nwho = { random = 20 }\n[[call]]\nmethod = \"eth_getBalance\"\nparams = [\"{who}\", \"latest\"]",
        )
        .unwrap();
        let mut rng = fastrand::Rng::with_seed(3);
        let drawn: std::collections::HashSet<String> = (0..1000).map(|_| mix.draw(&mut rng).1).collect();
        assert_eq!(drawn.len(), 1000);
        assert!(drawn.iter().all(|p| p.len() == r#"["0x","latest"]"#.len() + 40), "{:?}", drawn.iter().next());
        assert!(Mix::parse("[vars]\nwho = { random = 0 }\n[[call]]\nmethod = \"m\"").is_err());
    }

    #[test]
    fn mistakes_are_named() {
        let unknown = Mix::parse("[[call]]\nmethod = \"m\"\nwieght = 2").unwrap_err();
        assert!(unknown.contains("wieght"), "{unknown}");
        let missing = Mix::parse("[[call]]\nmethod = \"m\"\nparams = [\"{who}\"]").unwrap_err();
        assert!(missing.contains("{who}"), "{missing}");
        assert!(Mix::parse("").unwrap_err().contains("call"));
        assert!(Mix::single("m", "{}").is_err());
        assert_eq!(Mix::single("eth_call", r#"[{"to":"0x1"},"latest"]"#).unwrap().calls[0].params.len(), 2);
    }
}
