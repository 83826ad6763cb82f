package pools

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// errTooLarge marks ReadFile's refusal of a file over MaxFileSize.
var errTooLarge = errors.New("pools file too large")

// ReadFile reads the pools file at path, refusing one over MaxFileSize before reading a
// byte of it (a wrong path can name a disk image). It reads at most the size it found plus
// one byte, so a file that grows while it is read costs no more memory than the size it
// had: it is refused as changed while read (the next look reads it whole, or refuses it as
// too large). A file with no size (a pipe) is read through a reader limited to MaxFileSize.
// A non-nil error is an ErrorList of one entry.
func ReadFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, ErrorList{{File: path, Msg: "reading pools file: " + err.Error(), Err: err}}
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, ErrorList{{File: path, Msg: "reading pools file: " + err.Error(), Err: err}}
	}
	if st.Size() > MaxFileSize {
		return nil, ErrorList{{File: path, Msg: fmt.Sprintf("pools file is %d bytes; the limit is %d", st.Size(), MaxFileSize), Err: errTooLarge}}
	}
	if !st.Mode().IsRegular() {
		data, err := io.ReadAll(io.LimitReader(fh, MaxFileSize+1))
		if err != nil {
			return nil, ErrorList{{File: path, Msg: "reading pools file: " + err.Error(), Err: err}}
		}
		if len(data) > MaxFileSize {
			return nil, ErrorList{{File: path, Msg: fmt.Sprintf("pools file is over %d bytes, the limit", MaxFileSize), Err: errTooLarge}}
		}
		return data, nil
	}
	buf := make([]byte, st.Size()+1)
	n, err := io.ReadFull(fh, buf)
	switch {
	case err == nil: // more than the size found: it grew meanwhile
		return nil, ErrorList{{File: path, Msg: "pools file changed while being read", Err: errChanged}}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return buf[:n], nil
	}
	return nil, ErrorList{{File: path, Msg: "reading pools file: " + err.Error(), Err: err}}
}

// errChanged marks ReadFile's refusal of a file that grew while it was read: not an edit
// yet (the watcher looks again).
var errChanged = errors.New("pools file changed while being read")

// Watcher reloads a pools file whenever its content changes: the one reload loop of every
// tier that serves a pools file (`stickylb xds`, `stickylb xdp`). It polls, because polling
// survives editors that replace the file and config-map symlink swaps, which an inotify
// watch on the file loses. An edit that is invalid (every problem logged as file:line) or
// that Apply refuses is counted once in Errors, and the last good config keeps serving.
type Watcher struct {
	// Path is the pools file.
	Path string
	// Interval is the time between two looks at the file.
	Interval time.Duration
	// Current is the version being served (what Load returned), so that an edit made
	// between that Load and Run is not missed. Nil: the content Run first reads is taken
	// as the one being served.
	Current *File
	// Apply installs a valid new version. An error keeps the last good version serving;
	// the same content is not offered again until it changes.
	Apply func(*File) error
	// Log receives one line per problem of a rejected edit, and one per applied edit.
	Log *zap.Logger
	// Errors, when set, counts rejected edits: invalid, too large, or refused by Apply.
	Errors *atomic.Uint64
	// Edits, when set, hears how each edit went, for a status page.
	Edits EditRecorder
}

// EditRecorder hears how each edit a Watcher offers went (status.ConfigLog is one).
type EditRecorder interface {
	// Applied: the edit read at t serves now.
	Applied(t time.Time)
	// Refused: the edit read at t was refused for errs, each as file:line:col: message
	// where it has a place; the last good version keeps serving.
	Refused(t time.Time, errs []string)
}

// Run polls until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	var st watchState
	if w.Current != nil && w.Current.digest != ([sha256.Size]byte{}) {
		st.last = w.Current.digest
	} else if data, err := ReadFile(w.Path); err == nil {
		st.last = sha256.Sum256(data)
	}
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.poll(&st)
	}
}

type watchState struct {
	last    [sha256.Size]byte // digest of the content last offered (or of a refusal)
	readErr string            // the last unreadable-file error logged, so it is logged once
}

// poll looks at the file once and offers a changed content to Apply.
func (w *Watcher) poll(st *watchState) {
	data, err := ReadFile(w.Path)
	var sum [sha256.Size]byte
	switch {
	case err == nil:
		sum = sha256.Sum256(data)
	case errors.Is(err, errTooLarge):
		sum = sha256.Sum256([]byte(err.Error())) // nothing was read: the size stands in
	default:
		// Missing for a moment (a rename in progress) is not an edit.
		if msg := err.Error(); msg != st.readErr {
			w.Log.Warn("pools file unreadable; the last good config keeps serving", zap.Error(err))
			st.readErr = msg
		}
		return
	}
	st.readErr = ""
	if sum == st.last {
		return
	}
	st.last = sum
	read := time.Now()
	if err == nil {
		var f *File
		if f, err = Parse(w.Path, data); err == nil {
			if err = w.Apply(f); err == nil {
				w.Log.Info("pools file reloaded", zap.String("file", w.Path), zap.Int("services", len(f.Services)))
				if w.Edits != nil {
					w.Edits.Applied(read)
				}
				return
			}
		}
	}
	var msgs []string
	var list ErrorList
	if errors.As(err, &list) {
		for _, e := range list {
			w.Log.Error("invalid pools file edit; the last good config keeps serving", zap.String("error", e.Error()))
			msgs = append(msgs, e.Error())
		}
	} else {
		w.Log.Error("pools file edit not applied; the last good config keeps serving", zap.Error(err))
		msgs = append(msgs, err.Error())
	}
	// Counted and recorded after the lines are logged: whoever sees the count sees why.
	if w.Edits != nil {
		w.Edits.Refused(read, msgs)
	}
	if w.Errors != nil {
		w.Errors.Add(1)
	}
}
