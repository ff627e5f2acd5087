//! Path names as the job's system calls give them.

use alloc::string::String;
use alloc::vec::Vec;

/// `path` made absolute against `directory`, with `.`, `..` and repeated slashes resolved
/// (`..` of the root is the root, as on Linux); `None` for an empty path.
pub fn normalize(directory: &str, path: &str) -> Option<String> {
    if path.is_empty() {
        return None;
    }
    let mut components: Vec<&str> = Vec::new();
    let base = if path.starts_with('/') { "" } else { directory };
    for component in base.split('/').chain(path.split('/')) {
        match component {
            "" | "." => {}
            ".." => {
                components.pop();
            }
            name => components.push(name),
        }
    }
    let mut normalized = String::new();
    for component in &components {
        normalized.push('/');
        normalized.push_str(component);
    }
    if normalized.is_empty() {
        normalized.push('/');
    }
    Some(normalized)
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn every_form_of_path() {
        let table = [
            ("/", "a", Some("/a")),
            ("/", "/a/b", Some("/a/b")),
            ("/d", "a", Some("/d/a")),
            ("/d", "/a", Some("/a")),
            ("/", "a//b/", Some("/a/b")),
            ("/", "./a/./b", Some("/a/b")),
            ("/d/e", "../a", Some("/d/a")),
            ("/", "../../a", Some("/a")),
            ("/", "..", Some("/")),
            ("/d", ".", Some("/d")),
            ("/", "", None),
        ];
        for (directory, path, expected) in table {
            assert_eq!(normalize(directory, path).as_deref(), expected, "{path:?} in {directory:?}");
        }
    }
}
