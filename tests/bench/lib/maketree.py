#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Builds the benchmark's file tree: the first COUNT entries of SRC (a
sorted walk of /usr) with the same names, modes, owners, mtimes and
symlinks, but every regular file cut to at most MAXBYTES bytes.

Why not a real copy: /usr here is ~8.7 GB; the find/du/tar workloads are
about the number of entries, and a full copy would make setup slow and
fill the disk. Why not `cp -a --attributes-only`: it leaves every file
empty, which makes the tar workloads measure nothing but metadata.

The whole tree goes into BOTTOM/tree (the bottom lower layer), and every
EVERY-th regular file is also put, with the same content, into TOP/tree
(the top lower layer, with its parent directories). The merged view is
therefore identical to BOTTOM/tree, but about one directory in two
exists in both layers and has to be merged by the union filesystem, as
in a multi-layer container image.

usage: maketree.py SRC BOTTOM TOP COUNT MAXBYTES EVERY
Prints "entries files bytes" on stdout.
"""
import os
import stat
import sys


def copy_meta(src_st, dst, follow=True):
    """Owner, mode and times as cp -a would; errors (e.g. odd owners) are
    ignored: the tree only needs to look like /usr, not be exact."""
    try:
        os.chown(dst, src_st.st_uid, src_st.st_gid, follow_symlinks=follow)
        if follow:
            os.chmod(dst, stat.S_IMODE(src_st.st_mode))
        os.utime(dst, ns=(src_st.st_atime_ns, src_st.st_mtime_ns),
                 follow_symlinks=follow)
    except OSError:
        pass


def main():
    src, bottom, top, count, maxbytes, every = sys.argv[1:7]
    count, maxbytes, every = int(count), int(maxbytes), int(every)
    bottom = os.path.join(bottom, "tree")
    top = os.path.join(top, "tree")
    os.makedirs(bottom)
    os.makedirs(top)

    entries = files = nbytes = 0
    dirs_meta = []  # directory mtimes must be set after their content
    top_dirs = {""}

    def ensure_top_dir(rel):
        """Creates TOP/tree/rel and its parents, copying their modes."""
        if rel in top_dirs:
            return
        ensure_top_dir(os.path.dirname(rel))
        os.mkdir(os.path.join(top, rel))
        copy_meta(os.lstat(os.path.join(bottom, rel)), os.path.join(top, rel))
        top_dirs.add(rel)

    for root, dirnames, filenames in os.walk(src):
        dirnames.sort()
        rel_root = os.path.relpath(root, src)
        rel_root = "" if rel_root == "." else rel_root
        for name in sorted(dirnames + filenames):
            if entries >= count:
                break
            rel = os.path.join(rel_root, name)
            s = os.path.join(src, rel)
            d = os.path.join(bottom, rel)
            try:
                st = os.lstat(s)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(d)
                dirs_meta.append((st, d))
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(s), d)
                copy_meta(st, d, follow=False)
            elif stat.S_ISREG(st.st_mode):
                data = b""
                try:
                    fd = os.open(s, os.O_RDONLY)
                    try:
                        data = os.read(fd, maxbytes)
                    finally:
                        os.close(fd)
                except OSError:
                    pass
                fd = os.open(d, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                os.write(fd, data)
                os.close(fd)
                copy_meta(st, d)
                files += 1
                nbytes += len(data)
                if files % every == 0:
                    ensure_top_dir(rel_root)
                    t = os.path.join(top, rel)
                    fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    os.write(fd, data)
                    os.close(fd)
                    copy_meta(st, t)
            else:
                continue  # sockets, fifos, devices: none expected in /usr
            entries += 1
        # Directories past the count were created by os.walk's listing only
        # if we made them above; prune the walk to those we did make.
        dirnames[:] = [n for n in dirnames
                       if os.path.isdir(os.path.join(bottom, rel_root, n))
                       and not os.path.islink(os.path.join(bottom, rel_root, n))]
        if entries >= count:
            dirnames[:] = []
    for st, d in reversed(dirs_meta):
        copy_meta(st, d)
    for rel in top_dirs - {""}:
        copy_meta(os.lstat(os.path.join(bottom, rel)), os.path.join(top, rel))
    print(entries, files, nbytes)


if __name__ == "__main__":
    main()
