//! Configuration errors that point at the file, line, column and key an administrator must fix.

use std::fmt;
use std::path::PathBuf;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value in a configuration file is missing, malformed or inconsistent.
    #[error("{location}: {key}: {message}")]
    Invalid {
        location: Location,
        /// Key path, e.g. `target[0].lun[1].block-size`.
        key: String,
        message: String,
    },
    /// The file could not be parsed as TOML at all.
    #[error("{location}: {message}")]
    Syntax { location: Location, message: String },
    /// A command-line value is invalid (e.g. `--lun`).
    #[error("{flag}: {message}")]
    Cli { flag: String, message: String },
    /// The configuration file (or a `secret-file`) could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl ConfigError {
    pub(crate) fn cli(flag: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Cli {
            flag: flag.to_string(),
            message: message.into(),
        }
    }

    /// The key path the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Where in a file the error is, if it is in a file.
    pub fn location(&self) -> Option<&Location> {
        match self {
            ConfigError::Invalid { location, .. } | ConfigError::Syntax { location, .. } => {
                Some(location)
            }
            _ => None,
        }
    }
}

/// A position in a configuration file; lines and columns count from 1, columns in characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
}

impl Location {
    /// The position of byte `offset` of `text` (clamped to the text).
    pub fn at(file: PathBuf, text: &str, offset: usize) -> Location {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = text[line_start..offset].chars().count() + 1;
        Location { file, line, column }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_counts_lines_and_characters() {
        let text = "a = 1\nbé = 2\n";
        let loc = Location::at("x.toml".into(), text, text.find('=').unwrap());
        assert_eq!((loc.line, loc.column), (1, 3));
        let second = text.rfind('=').unwrap();
        let loc = Location::at("x.toml".into(), text, second);
        assert_eq!((loc.line, loc.column), (2, 4));
        assert_eq!(loc.to_string(), "x.toml:2:4");
        let end = Location::at("x.toml".into(), text, 999);
        assert_eq!(end.line, 3);
    }
}
