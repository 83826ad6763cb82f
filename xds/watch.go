package xds

import (
	"bytes"
	"context"
	"errors"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/stickylb/stickylb/policies/pools"
)

// Watch reloads path into s whenever its content changes, polling every interval (polling
// survives editors that replace the file and config-map symlink swaps, which inotify
// watches on the file lose). An invalid edit is logged with every file:line, counted, and
// the last good config keeps serving. applied, when set, runs after each applied reload
// (the health monitor retargets there). Watch returns when ctx ends.
func Watch(ctx context.Context, path string, interval time.Duration, s *Server, log *zap.Logger, applied func(*pools.File)) {
	last, _ := os.ReadFile(path)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		data, err := os.ReadFile(path)
		if err != nil || bytes.Equal(data, last) {
			continue
		}
		last = data
		f, err := pools.Parse(path, data)
		if err != nil {
			s.Stats.ReloadErrors.Add(1)
			var list pools.ErrorList
			if errors.As(err, &list) {
				for _, e := range list {
					log.Error("invalid pools file edit; the last good config keeps serving", zap.String("error", e.Error()))
				}
			}
			continue
		}
		if err := s.Update(f); err != nil {
			log.Error("pools file edit not applied; the last good config keeps serving", zap.Error(err))
			continue
		}
		if applied != nil {
			applied(f)
		}
		log.Info("pools file reloaded", zap.String("file", path), zap.Int("services", len(f.Services)))
	}
}
