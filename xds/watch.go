package xds

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/pools"
	"github.com/stickylb/stickylb/policies/status"
)

// Watch reloads path into s whenever its content changes, polling every interval, through
// the shared pools.Watcher: an invalid or untranslatable edit is logged with every
// file:line, counted once in Stats.ReloadErrors, shown on the status page with its first
// errors until an edit applies, and the last good config keeps serving.
// applied, when set, runs after each applied reload (the health monitor retargets there).
// Watch returns when ctx ends.
func Watch(ctx context.Context, path string, interval time.Duration, s *Server, log *zap.Logger, applied func(*pools.File)) {
	edits := status.NewConfigLog(path, time.Now())
	s.edits.Store(edits)
	w := pools.Watcher{
		Path:     path,
		Interval: interval,
		Current:  s.currentFile(),
		Log:      log,
		Errors:   &s.Stats.ReloadErrors,
		Edits:    edits,
		Apply: func(f *pools.File) error {
			if err := s.Update(f); err != nil {
				return err
			}
			if applied != nil {
				applied(f)
			}
			return nil
		},
	}
	w.Run(ctx)
}
