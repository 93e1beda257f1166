"""Static files with hashed names (Django's ManifestStaticFilesStorage), served by ServeStatic.

After `collectstatic` (make run, `shiftlog run`, a deploy's release step), pages name each file
by its content's hash (`shiftlog.3f2a….css`) and ServeStatic serves those names with a year's
cache (immutable): a deploy with a changed file gives it a new name, which browsers fetch at once.
Before `collectstatic` has run in the data folder (the tests, a fresh checkout's first
`manage.py runserver`), there is no manifest: pages name the plain files, which ServeStatic finds
in the apps (SERVESTATIC_USE_FINDERS) with a short cache, instead of failing with a 500.
"""

from __future__ import annotations

from django.contrib.staticfiles.storage import ManifestStaticFilesStorage


class HashedStaticFilesStorage(ManifestStaticFilesStorage):
    def stored_name(self, name: str) -> str:
        if not self.hashed_files:  # nothing collected here yet: the plain name
            return name
        return super().stored_name(name)
