//! `key=value` words on the kernel command line.

pub struct Cmdline(pub &'static str);

impl Cmdline {
    /// The value of the last `key=value` word (the VMM appends its `clowder.*` keys, so later
    /// words win); `Some("")` for a bare `key`.
    pub fn get(&self, key: &str) -> Option<&'static str> {
        let mut found = None;
        for word in self.0.split_ascii_whitespace() {
            match word.split_once('=') {
                Some((name, value)) if name == key => found = Some(value),
                None if word == key => found = Some(""),
                _ => {}
            }
        }
        found
    }

    /// A test parameter: decimal, or hexadecimal with `0x`.
    pub fn number(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(parse_number)
    }

    /// A `clowder.*` value: hexadecimal, with or without `0x`.
    pub fn hex(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(parse_hex)
    }
}

pub fn parse_number(text: &str) -> Option<u64> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

pub fn parse_hex(text: &str) -> Option<u64> {
    let digits = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")).unwrap_or(text);
    u64::from_str_radix(digits, 16).ok()
}
