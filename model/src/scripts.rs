//! The scripts as the library sends them ([`fencelock::lua_scripts`]: every script
//! composed with its fragments, for a standalone node and, under `cluster/`, those a
//! Redis Cluster gets in another form), and textual mutations of them.

use std::collections::BTreeMap;

/// Every script the library sends, by name (`lock/acquire.lua`,
/// `cluster/lock/release.lua`, ...), its text exactly as sent.
#[derive(Clone, Debug)]
pub struct Scripts {
    by_name: BTreeMap<String, String>,
}

impl Default for Scripts {
    fn default() -> Self {
        Self::shipped()
    }
}

/// A textual patch of one script: `find` must occur in it exactly once, and becomes
/// `replace`. A patch that no longer applies (the script changed) is an error, so a
/// stale control fails loudly instead of testing nothing.
#[derive(Clone, Copy, Debug)]
pub struct Patch {
    /// The script's name, as [`Scripts::get`] takes it.
    pub script: &'static str,
    /// The text to find, exactly once.
    pub find: &'static str,
    /// What it becomes.
    pub replace: &'static str,
}

impl Scripts {
    /// The library's scripts as shipped.
    pub fn shipped() -> Scripts {
        Scripts {
            by_name: fencelock::lua_scripts()
                .map(|(name, text)| (name.to_owned(), text))
                .collect(),
        }
    }

    /// The script `name` (`lock/acquire.lua`; `cluster/...` for a cluster's form).
    ///
    /// # Panics
    /// If the library ships no such script: the model names scripts the library has.
    pub fn get(&self, name: &str) -> &str {
        self.by_name
            .get(name)
            .unwrap_or_else(|| panic!("the library ships no script named {name}"))
    }

    /// Every script, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.by_name.iter().map(|(n, t)| (n.as_str(), t.as_str()))
    }

    /// These scripts with `patch` applied.
    ///
    /// # Errors
    /// If the script is missing or `patch.find` does not occur in it exactly once.
    pub fn patched(&self, patch: &Patch) -> Result<Scripts, String> {
        let text = self
            .by_name
            .get(patch.script)
            .ok_or_else(|| format!("the patch's script {} is not shipped", patch.script))?;
        let found = text.matches(patch.find).count();
        if found != 1 {
            return Err(format!(
                "the patch of {} is stale: {:?} occurs {found} times in the script as \
                 shipped, not once",
                patch.script, patch.find
            ));
        }
        let mut out = self.clone();
        out.by_name.insert(
            patch.script.to_owned(),
            text.replacen(patch.find, patch.replace, 1),
        );
        Ok(out)
    }
}
