//! The guest's initramfs: a static busybox, the modules that mount the host's root over
//! virtiofs, and an init that mounts it, runs the script named on the kernel command line
//! inside it (chroot), prints the script's exit status and powers off.

use std::{
    collections::BTreeMap,
    fs::{self, File},
    io::{BufWriter, Write as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

/// The modules the init needs (the PCI transport and the filesystem); their dependencies are
/// found in each module's `depends=` (the package has no modules.dep).
const MODULES: [&str; 2] = ["virtio_pci", "virtiofs"];

/// The virtiofs tag QEMU gives the host's root.
pub const TAG: &str = "hostroot";
/// The line the init prints last; the host reads the guest's exit status from it (QEMU
/// exits 0 on `poweroff -f` whatever the guest's tests did).
pub const EXIT_MARKER: &str = "vmtest-exit=";

const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "vmtest: guest init: $*"; echo "vmtest-exit=125"; poweroff -f; }
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in /modules/*.ko; do insmod "$m" || fail "insmod $m"; done
script=$(sed -n 's/.*vmtest\.script=\([^ ]*\).*/\1/p' /proc/cmdline)
[ -n "$script" ] || fail "no vmtest.script= on the kernel command line"
mkdir -p /host
mount -t virtiofs @TAG@ /host || fail "mounting the host's root over virtiofs"
# The guest's own kernel filesystems. Its temp files go to its own RAM /dev/shm (TMPDIR in
# the script), not to a tmpfs over /tmp, which would hide a workspace that lives under /tmp.
mount -t proc proc /host/proc || fail "proc"
mount -t sysfs sysfs /host/sys || fail "sysfs"
mount -t devtmpfs devtmpfs /host/dev || fail "devtmpfs"
mkdir -p /host/dev/shm /host/dev/pts
mount -t tmpfs tmpfs /host/dev/shm || fail "/dev/shm"
mount -t devpts devpts /host/dev/pts || fail "devpts"
mount -t tracefs tracefs /host/sys/kernel/tracing || fail "tracefs"
mount -t debugfs debugfs /host/sys/kernel/debug || fail "debugfs"
mount -t bpf bpf /host/sys/fs/bpf || fail "bpffs"
ip link set lo up || fail "lo"
chroot /host /bin/sh "$script"
echo "vmtest-exit=$?"
poweroff -f
"#;

/// Writes the initramfs (uncompressed newc cpio) to `out`.
pub fn write(busybox: &Path, modules: &Path, out: &Path) -> anyhow::Result<()> {
    let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut archive = Archive {
        out: BufWriter::new(file),
        ino: 1,
    };
    for dir in ["bin", "dev", "proc", "sys", "modules"] {
        archive.entry(dir, 0o040_755, &[])?;
    }
    archive.entry("init", 0o100_755, INIT.replace("@TAG@", TAG).as_bytes())?;
    let busybox = fs::read(busybox).with_context(|| format!("reading {}", busybox.display()))?;
    archive.entry("bin/busybox", 0o100_755, &busybox)?;
    let mut found = BTreeMap::new();
    find_modules(modules, &mut found)?;
    let mut order = Vec::new();
    for module in MODULES {
        load_order(module, &found, &mut order)?;
    }
    for (i, (name, bytes)) in order.iter().enumerate() {
        // Numbered so that the init's glob loads them in order.
        archive.entry(&format!("modules/{i:02}-{name}.ko"), 0o100_644, bytes)?;
    }
    let out = cpio::newc::trailer(archive.out)?;
    out.into_inner()
        .map_err(|err| err.into_error())?
        .sync_all()?;
    Ok(())
}

/// Every `*.ko` under `dir`, by module name (`-` as `_`, as the kernel names them).
fn find_modules(dir: &Path, found: &mut BTreeMap<String, PathBuf>) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            find_modules(&path, found)?;
        } else if let Some(stem) = path
            .file_name()
            .and_then(|n| n.to_str()?.strip_suffix(".ko"))
        {
            found.insert(stem.replace('-', "_"), path);
        }
    }
    Ok(())
}

/// Appends `module`'s dependencies, then `module`, unless already there.
fn load_order(
    module: &str,
    found: &BTreeMap<String, PathBuf>,
    order: &mut Vec<(String, Vec<u8>)>,
) -> anyhow::Result<()> {
    if order.iter().any(|(name, _)| name == module) {
        return Ok(());
    }
    let Some(path) = found.get(module) else {
        bail!("the guest kernel has no module {module} (built in, or missing?)");
    };
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    for dependency in depends(&bytes) {
        load_order(&dependency, found, order)?;
    }
    order.push((module.to_owned(), bytes));
    Ok(())
}

/// The `depends=a,b` entry of a module's .modinfo strings.
fn depends(module: &[u8]) -> Vec<String> {
    module
        .split(|&b| b == 0)
        .find_map(|field| field.strip_prefix(b"depends="))
        .map(|list| {
            String::from_utf8_lossy(list)
                .split(',')
                .filter(|name| !name.is_empty())
                .map(|name| name.replace('-', "_"))
                .collect()
        })
        .unwrap_or_default()
}

struct Archive {
    out: BufWriter<File>,
    ino: u32,
}

impl Archive {
    fn entry(&mut self, name: &str, mode: u32, bytes: &[u8]) -> anyhow::Result<()> {
        let size = u32::try_from(bytes.len()).context("file too large for cpio")?;
        let mut writer = cpio::newc::Builder::new(name)
            .ino(self.ino)
            .mode(mode)
            .nlink(1)
            .write(&mut self.out, size);
        writer.write_all(bytes)?;
        writer.finish()?;
        self.ino += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depends_reads_the_modinfo_entry() {
        let module = b"\x7fELF...\0license=GPL\0depends=virtio_ring,virtio-pci\0name=x\0";
        assert_eq!(depends(module), ["virtio_ring", "virtio_pci"]);
        assert!(depends(b"\0depends=\0name=fuse\0").is_empty());
        assert!(depends(b"no modinfo").is_empty());
    }

    #[test]
    fn dependencies_load_first_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("fs/fuse");
        fs::create_dir_all(&nested).unwrap();
        fs::write(nested.join("virtiofs.ko"), b"\0depends=fuse,virtio\0").unwrap();
        fs::write(nested.join("fuse.ko"), b"\0depends=\0").unwrap();
        fs::write(dir.path().join("virtio.ko"), b"\0depends=virtio_ring\0").unwrap();
        fs::write(dir.path().join("virtio_ring.ko"), b"\0").unwrap();
        fs::write(dir.path().join("virtio_pci.ko"), b"\0depends=virtio\0").unwrap();
        let mut found = BTreeMap::new();
        find_modules(dir.path(), &mut found).unwrap();
        let mut order = Vec::new();
        for module in MODULES {
            load_order(module, &found, &mut order).unwrap();
        }
        let names: Vec<&str> = order.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            ["virtio_ring", "virtio", "virtio_pci", "fuse", "virtiofs"]
        );
        let err = load_order("absent", &found, &mut order).unwrap_err();
        assert!(err.to_string().contains("no module absent"), "{err}");
    }
}
