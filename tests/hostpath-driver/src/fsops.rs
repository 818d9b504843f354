//! File system work: data directories, sparse-aware tree copies, bind
//! mounts, loop devices.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::Error;

/// Creates a volume or snapshot data directory, world-writable like the
/// upstream driver's so that any pod user can write into a published volume.
pub(crate) fn create_data_dir(path: &Path) -> Result<(), Error> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o777)
        .create(path)
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)))
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))
}

/// Creates or resizes the sparse file `path` to `len` bytes.
pub(crate) fn set_file_len(path: &Path, len: u64) -> Result<(), Error> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    file.set_len(len)
        .map_err(|e| Error::io(format!("resizing {} to {len} bytes", path.display()), e))
}

/// Copies the contents of directory `src` into the existing directory
/// `dst`: regular files (holes preserved), directories, symlinks (as
/// symlinks) and permission bits. Other file types are skipped.
pub(crate) fn copy_tree(src: &Path, dst: &Path) -> Result<(), Error> {
    let entries =
        std::fs::read_dir(src).map_err(|e| Error::io(format!("reading {}", src.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("reading {}", src.display()), e))?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let meta = std::fs::symlink_metadata(&from)
            .map_err(|e| Error::io(format!("inspecting {}", from.display()), e))?;
        let file_type = meta.file_type();
        if file_type.is_dir() {
            std::fs::create_dir(&to)
                .map_err(|e| Error::io(format!("creating {}", to.display()), e))?;
            copy_tree(&from, &to)?;
        } else if file_type.is_symlink() {
            let target = std::fs::read_link(&from)
                .map_err(|e| Error::io(format!("reading link {}", from.display()), e))?;
            std::os::unix::fs::symlink(&target, &to)
                .map_err(|e| Error::io(format!("creating link {}", to.display()), e))?;
            continue;
        } else if file_type.is_file() {
            copy_sparse_file(&from, &to)?;
        } else {
            tracing::warn!(path = %from.display(), "skipping special file while copying");
            continue;
        }
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(|e| Error::io(format!("setting permissions of {}", to.display()), e))?;
    }
    Ok(())
}

/// Copies a regular file, copying only its data extents (SEEK_DATA /
/// SEEK_HOLE) so that a sparse block volume stays sparse.
fn copy_sparse_file(from: &Path, to: &Path) -> Result<(), Error> {
    let io_err = |what: &str, e: std::io::Error| Error::io(format!("{what} {}", from.display()), e);
    let mut src = File::open(from).map_err(|e| io_err("opening", e))?;
    let len = src.metadata().map_err(|e| io_err("inspecting", e))?.len();
    let mut dst =
        File::create(to).map_err(|e| Error::io(format!("creating {}", to.display()), e))?;
    let fd = src.as_raw_fd();
    let mut offset: u64 = 0;
    let mut buf = vec![0u8; 1 << 20];
    while offset < len {
        let (data, hole) = match data_extent(fd, offset) {
            Ok(Some(extent)) => extent,
            Ok(None) => break,
            // File systems without SEEK_DATA support: copy everything.
            Err(_) => (offset, len),
        };
        src.seek(SeekFrom::Start(data))
            .map_err(|e| io_err("seeking", e))?;
        dst.seek(SeekFrom::Start(data))
            .map_err(|e| Error::io(format!("seeking {}", to.display()), e))?;
        let mut remaining = hole.min(len) - data;
        while remaining > 0 {
            let want = usize::try_from(remaining.min(buf.len() as u64)).unwrap_or(buf.len());
            let n = src
                .read(&mut buf[..want])
                .map_err(|e| io_err("reading", e))?;
            if n == 0 {
                break;
            }
            dst.write_all(&buf[..n])
                .map_err(|e| Error::io(format!("writing {}", to.display()), e))?;
            remaining -= n as u64;
        }
        offset = hole;
    }
    dst.set_len(len)
        .map_err(|e| Error::io(format!("resizing {}", to.display()), e))?;
    Ok(())
}

/// The next data extent at or after `offset`: `Some((start, end))`, or
/// `None` when only a hole remains.
fn data_extent(fd: i32, offset: u64) -> std::io::Result<Option<(u64, u64)>> {
    let off = libc::off_t::try_from(offset)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: lseek on a file descriptor owned by the caller's open File.
    let data = unsafe { libc::lseek(fd, off, libc::SEEK_DATA) };
    if data < 0 {
        let err = std::io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(err)
        };
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
    if hole < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Some((data as u64, hole as u64)))
}

/// Bytes and inodes used below `path` (apparent file sizes; `path` itself
/// not counted as an inode).
pub(crate) fn tree_usage(path: &Path) -> std::io::Result<(u64, u64)> {
    let mut bytes = 0u64;
    let mut inodes = 0u64;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = std::fs::symlink_metadata(entry.path())?;
            inodes += 1;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                bytes = bytes.saturating_add(meta.len());
            }
        }
    }
    Ok((bytes, inodes))
}

fn cstring(path: &Path) -> std::io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// Bind-mounts `source` onto `target` (read-only when asked).
pub(crate) fn bind_mount(source: &Path, target: &Path, readonly: bool) -> std::io::Result<()> {
    let src = cstring(source)?;
    let tgt = cstring(target)?;
    // SAFETY: valid NUL-terminated strings; null fstype/data are allowed for MS_BIND.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if readonly {
        // SAFETY: as above; a remount changes the flags of the bind mount just made.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                tgt.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            let _ = unmount(target);
            return Err(err);
        }
    }
    Ok(())
}

/// Unmounts `target`.
pub(crate) fn unmount(target: &Path) -> std::io::Result<()> {
    let tgt = cstring(target)?;
    // SAFETY: valid NUL-terminated string.
    let rc = unsafe { libc::umount2(tgt.as_ptr(), 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `path` is a mount point of this process's mount namespace
/// (per `/proc/self/mountinfo`).
pub(crate) fn is_mount_point(path: &Path) -> std::io::Result<bool> {
    let canonical = canonical_without_last_link(path)?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(info.lines().any(|line| {
        line.split(' ')
            .nth(4)
            .is_some_and(|mp| Path::new(&unescape_mountinfo(mp)) == canonical)
    }))
}

/// `path` with its parent canonicalized and its last component kept as is.
fn canonical_without_last_link(path: &Path) -> std::io::Result<PathBuf> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => {
            Ok(parent.canonicalize()?.join(name))
        }
        _ => Ok(path.to_path_buf()),
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `ioctl` requests of `linux/loop.h`.
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
/// The block major number of loop devices (`Documentation/admin-guide/devices.txt`).
const LOOP_MAJOR: u32 = 7;

/// The loop device backed by `file`, attaching a free one when there is
/// none. A block volume is published as a block device: the kubelet
/// bind-mounts the publish target into the pod's device map and the
/// container runtime adds it to the container as a device node, which a
/// regular file cannot be. Without the privilege to attach one (no
/// `/dev/loop-control` access) the error is returned.
pub(crate) fn attach_loop(file: &Path) -> std::io::Result<PathBuf> {
    if let Some(device) = find_loop(file)? {
        return Ok(device);
    }
    let backing = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)?;
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    // Another process may take the free device between the two calls
    // (EBUSY): ask again.
    let mut last_error = None;
    for _ in 0..8 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number.
        let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if number < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let device = PathBuf::from(format!("/dev/loop{number}"));
        let loop_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&device)?;
        // SAFETY: LOOP_SET_FD takes the backing file's descriptor, open for
        // the duration of the call.
        let rc = unsafe {
            libc::ioctl(
                loop_file.as_raw_fd(),
                LOOP_SET_FD,
                libc::c_ulong::try_from(backing.as_raw_fd()).unwrap_or(0),
            )
        };
        if rc == 0 {
            return Ok(device);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EBUSY) {
            return Err(err);
        }
        last_error = Some(err);
    }
    Err(last_error.unwrap_or_else(|| std::io::Error::other("no free loop device")))
}

/// Detaches the loop device backed by `file`, if there is one. A device
/// still open elsewhere is detached by the kernel when it is last closed.
pub(crate) fn detach_loop(file: &Path) -> std::io::Result<()> {
    match find_loop(file)? {
        Some(device) => clear_loop(&device),
        None => Ok(()),
    }
}

/// Detaches the loop device with device number `rdev`, found by its
/// number where its backing file can no longer be named (deleted); not a
/// loop device, or one no longer attached, is fine.
pub(crate) fn detach_loop_device(rdev: u64) -> std::io::Result<()> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    if major != LOOP_MAJOR {
        return Ok(());
    }
    // /sys/dev/block/<major>:<minor> links to the device's folder, named
    // as its node in /dev.
    let link = match std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")) {
        Ok(link) => link,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    match link.file_name() {
        Some(name) => clear_loop(&Path::new("/dev").join(name)),
        None => Ok(()),
    }
}

fn clear_loop(device: &Path) -> std::io::Result<()> {
    let loop_file = std::fs::File::open(device)?;
    // SAFETY: LOOP_CLR_FD takes no argument.
    let rc = unsafe { libc::ioctl(loop_file.as_raw_fd(), LOOP_CLR_FD) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        // ENXIO: not attached (any more).
        if err.raw_os_error() != Some(libc::ENXIO) {
            return Err(err);
        }
    }
    Ok(())
}

/// The loop device whose backing file is `file` (per
/// `/sys/block/loop*/loop/backing_file`).
pub(crate) fn find_loop(file: &Path) -> std::io::Result<Option<PathBuf>> {
    let wanted = match file.canonicalize() {
        Ok(path) => path,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let entries = match std::fs::read_dir("/sys/block") {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with("loop")) else {
            continue;
        };
        if backing_file(&Path::new("/sys/block").join(name))?.as_deref() == Some(&wanted) {
            return Ok(Some(Path::new("/dev").join(name)));
        }
    }
    Ok(None)
}

/// The backing file of the loop device with device number `rdev`; `None`
/// when it is not an attached loop device.
pub(crate) fn loop_backing_file(rdev: u64) -> std::io::Result<Option<PathBuf>> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    if major != LOOP_MAJOR {
        return Ok(None);
    }
    backing_file(Path::new(&format!("/sys/dev/block/{major}:{minor}")))
}

/// `<sysfs device>/loop/backing_file`, which exists while a file is
/// attached.
fn backing_file(sys_device: &Path) -> std::io::Result<Option<PathBuf>> {
    match std::fs::read_to_string(sys_device.join("loop").join("backing_file")) {
        Ok(path) => Ok(Some(PathBuf::from(path.trim_end_matches('\n')))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape() {
        assert_eq!(unescape_mountinfo(r"/a\040b"), "/a b");
        assert_eq!(unescape_mountinfo(r"/a\134b"), r"/a\b");
        assert_eq!(unescape_mountinfo(r"/plain"), "/plain");
        assert_eq!(unescape_mountinfo(r"/x\04"), r"/x\04");
    }

    #[test]
    fn root_is_a_mount_point_and_a_fresh_dir_is_not() {
        assert!(is_mount_point(Path::new("/")).expect("mountinfo"));
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(!is_mount_point(dir.path()).expect("mountinfo"));
    }

    #[test]
    fn copy_tree_copies_files_links_dirs_and_keeps_holes() {
        let src = tempfile::tempdir().expect("tempdir");
        let dst = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(src.path().join("sub")).expect("mkdir");
        std::fs::write(src.path().join("sub").join("f"), b"hello").expect("write");
        std::os::unix::fs::symlink("sub/f", src.path().join("link")).expect("symlink");
        let sparse = src.path().join("sparse");
        set_file_len(&sparse, 64 << 20).expect("sparse");
        {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&sparse)
                .expect("open");
            f.seek(SeekFrom::Start(32 << 20)).expect("seek");
            f.write_all(b"middle").expect("write");
        }
        std::fs::set_permissions(
            src.path().join("sub").join("f"),
            std::fs::Permissions::from_mode(0o640),
        )
        .expect("chmod");
        copy_tree(src.path(), dst.path()).expect("copy");
        assert_eq!(
            std::fs::read(dst.path().join("sub").join("f")).expect("read"),
            b"hello"
        );
        assert_eq!(
            std::fs::read_link(dst.path().join("link")).expect("link"),
            Path::new("sub/f")
        );
        let meta = std::fs::metadata(dst.path().join("sub").join("f")).expect("meta");
        assert_eq!(meta.mode() & 0o777, 0o640);
        let copied = dst.path().join("sparse");
        let meta = std::fs::metadata(&copied).expect("meta");
        assert_eq!(meta.len(), 64 << 20);
        let mut f = File::open(&copied).expect("open");
        f.seek(SeekFrom::Start(32 << 20)).expect("seek");
        let mut buf = [0u8; 6];
        f.read_exact(&mut buf).expect("read");
        assert_eq!(&buf, b"middle");
        // Far fewer blocks allocated than the apparent size.
        assert!(meta.blocks() * 512 < 16 << 20, "blocks {}", meta.blocks());
        let (bytes, inodes) = tree_usage(dst.path()).expect("usage");
        assert_eq!(bytes, 5 + (64 << 20));
        assert_eq!(inodes, 4);
    }
}
