from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from agents import export
from agents.management.base import BaseCommand, fail, get_run, id_arg, named_checkpoint


class Command(BaseCommand):
    help = (
        "Export a run's checkpoint N as a .tar.gz (RUN N --out FILE|FOLDER|-), or the change "
        "from checkpoint A to B (or to `live`, the run's workspace now) as a patch for "
        "`git apply` (RUN B|live --patch-from A [--out FILE|FOLDER]; standard output without "
        "--out). A checkpoint of another run is OTHER:N."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=id_arg, metavar="RUN")
        parser.add_argument("checkpoint", metavar="N|B|live")
        parser.add_argument("--patch-from", metavar="A", help="write the patch from A to B")
        parser.add_argument(
            "--out", metavar="FILE", help="a file, a folder (named after the checkpoint) or -"
        )

    def handle(self, *args, **o):
        out = o["out"]
        run = get_run(o["run_id"])
        if o["patch_from"] is not None:
            if o["patch_from"] == "live":
                raise fail("`live` can only be the target: --patch-from takes a checkpoint number")
            a = named_checkpoint(run.pk, o["patch_from"])
            b = None if o["checkpoint"] == "live" else named_checkpoint(run.pk, o["checkpoint"])
            try:
                chunks = export.patch_chunks(a, b)
            except export.ExportError as e:
                raise fail(str(e)) from None
            name, binary = export.patch_name(a, b) + ".patch", False
        else:
            if o["checkpoint"] == "live":
                raise fail("a tar is made of a checkpoint, not of `live`: give a checkpoint number")
            if not out:
                raise fail("say where the .tar.gz goes: --out FILE, --out FOLDER or --out -")
            cp = named_checkpoint(run.pk, o["checkpoint"])
            try:
                chunks = export.tar_chunks(cp)
            except export.ExportError as e:
                raise fail(str(e)) from None
            name, binary = export.tar_name(cp) + ".tar.gz", True
        if not out or out == "-":
            if binary and sys.stdout.isatty():
                raise fail("a .tar.gz is not for a terminal: give --out FILE or pipe it")
            self._to_stdout(chunks, binary)
            return
        target = Path(out)
        if target.is_dir():
            target = target / name
        written = self._to_file(chunks, target)
        self.stderr.write(f"wrote {written:,} bytes to {target}")

    def _to_stdout(self, chunks: Iterator[bytes], binary: bool) -> None:
        try:
            for chunk in chunks:
                if binary:
                    sys.stdout.buffer.write(chunk)
                else:
                    # A patch is valid UTF-8 (names are quoted), so it goes as text.
                    self.stdout.write_exact(chunk.decode("utf-8"))
        except export.ExportError as e:
            raise fail(f"export broken off: {e}") from None
        if binary:
            sys.stdout.flush()

    def _to_file(self, chunks: Iterator[bytes], target: Path) -> int:
        """Write to a temporary file beside `target`, renamed into place only when complete."""
        try:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
        except OSError as e:
            raise fail(f"cannot write {target}: {e.strerror or e}") from None
        written = 0
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    written += len(chunk)
            os.chmod(tmp, 0o644 & ~_umask())
            os.replace(tmp, target)
        except export.ExportError as e:
            raise fail(f"export broken off, nothing written: {e}") from None
        except OSError as e:
            raise fail(f"cannot write {target}: {e.strerror or e}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return written


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
