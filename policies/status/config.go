package status

import (
	"sync"
	"time"
)

// MaxRefusedErrors is how many errors of a refused edit the status keeps (the log has all).
const MaxRefusedErrors = 5

// ConfigFile is the file a tier serves (the pools file of `stickylb xds` and `stickylb xdp
// --pools`) and how its last edit went, so that an edit refused while the last good version
// keeps serving shows on the page, not only in the log and a counter.
type ConfigFile struct {
	// Path is the file as the command line names it.
	Path string `json:"path"`
	// Loaded is when the version serving now was read: at start, or its edit applied.
	Loaded time.Time `json:"loaded"`
	// Refused is the last edit when it was refused; nil when the last edit applied or no
	// edit was made since start.
	Refused *RefusedEdit `json:"refused,omitempty"`
}

// RefusedEdit is a refused edit of the file; the version loaded before it keeps serving.
type RefusedEdit struct {
	// Time is when the edit was read.
	Time time.Time `json:"time"`
	// Errors are its first MaxRefusedErrors errors, each as file:line:col: message.
	Errors []string `json:"errors"`
	// More counts its errors beyond those.
	More int `json:"more,omitempty"`
}

// ConfigLog records the edits of a tier's file for its status page: a pools.Watcher's
// Edits. Safe for concurrent use.
type ConfigLog struct {
	mu   sync.Mutex
	file ConfigFile
}

// NewConfigLog starts the record of the file at path, whose serving version was read at
// loaded.
func NewConfigLog(path string, loaded time.Time) *ConfigLog {
	return &ConfigLog{file: ConfigFile{Path: path, Loaded: loaded}}
}

// Applied records an edit read at t that now serves.
func (l *ConfigLog) Applied(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.file.Loaded, l.file.Refused = t, nil
}

// Refused records an edit read at t and refused for errs.
func (l *ConfigLog) Refused(t time.Time, errs []string) {
	r := &RefusedEdit{Time: t, Errors: append([]string(nil), errs[:min(len(errs), MaxRefusedErrors)]...)}
	r.More = len(errs) - len(r.Errors)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.file.Refused = r
}

// File returns a copy of the record for a Snapshot; nil for a nil log (a tier serving no
// file of its own, such as an XDP node fed by a control plane).
func (l *ConfigLog) File() *ConfigFile {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.file
	return &f
}
