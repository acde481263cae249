//! RC4, which NTLM still uses for the key exchange and for sealing MIC checksums.

pub(crate) struct Rc4 {
    s: [u8; 256],
    i: u8,
    j: u8,
}

// Every index is a u8 (or below 256) into a 256-entry table, so none can be out of bounds.
#[allow(clippy::indexing_slicing)]
impl Rc4 {
    pub(crate) fn new(key: &[u8]) -> Self {
        let mut s = [0u8; 256];
        for (n, v) in s.iter_mut().enumerate() {
            *v = n as u8;
        }
        if !key.is_empty() {
            let mut j = 0u8;
            for n in 0..256usize {
                let k = key.get(n % key.len()).copied().unwrap_or(0);
                j = j.wrapping_add(s[n]).wrapping_add(k);
                s.swap(n, usize::from(j));
            }
        }
        Rc4 { s, i: 0, j: 0 }
    }

    pub(crate) fn apply(&mut self, data: &mut [u8]) {
        for b in data {
            self.i = self.i.wrapping_add(1);
            self.j = self.j.wrapping_add(self.s[usize::from(self.i)]);
            self.s.swap(usize::from(self.i), usize::from(self.j));
            let t = self.s[usize::from(self.i)].wrapping_add(self.s[usize::from(self.j)]);
            *b ^= self.s[usize::from(t)];
        }
    }
}
