package docs

import (
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readersFiles are the file names the guides use for the reader's own files, not the
// repository's: each must be one a reader makes, which the sentence around it says.
var readersFiles = map[string]string{
	"pools.yaml": "the reader's pools file",
	"Caddyfile":  "the reader's Caddyfile",
	"server.pem": "the control plane's certificate",
	"server.key": "the control plane's key",
	"ca.pem":     "the reader's CA",
	"n.pem":      "a node's certificate",
	"n.key":      "a node's key",
	"c.pem":      "the replicas' etcd client certificate",
	"c.key":      "the replicas' etcd client key",
	"api.pem":    "the change API's certificate",
	"api.key":    "the change API's key",
	"op.pem":     "an operator's client certificate for the change API",
	"op.key":     "an operator's client key",
	"ops-ca.pem": "the CA of the operators' client certificates for the change API",
	"state.json": "a readable copy of the stored state the reader makes",
}

// shellBlocks returns the sh code blocks of a markdown file, each with the line it starts on.
func shellBlocks(t *testing.T, path string) (blocks []string, lines []int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cur *strings.Builder
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && (l == "```sh" || l == "```bash" || l == "```shell"):
			cur = &strings.Builder{}
			lines = append(lines, i+2)
		case cur != nil && strings.HasPrefix(l, "```"):
			blocks = append(blocks, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(l + "\n")
		}
	}
	return blocks, lines
}

// word is a shell word of a command and whether any of it was quoted (quoted words are
// data: a JSON body, a jq program).
type word struct {
	text   string
	quoted bool
}

// commands splits a block of shell into commands (at newlines, ';', '&&', '|'), joining
// backslash-continued lines and dropping comments. It knows as much of the shell as the
// docs use.
func commands(block string) [][]word {
	var cmds [][]word
	var cmd []word
	var cur strings.Builder
	inWord, quoted := false, false
	endWord := func() {
		if inWord {
			cmd = append(cmd, word{cur.String(), quoted})
		}
		cur.Reset()
		inWord, quoted = false, false
	}
	endCmd := func() {
		endWord()
		if len(cmd) > 0 {
			cmds = append(cmds, cmd)
		}
		cmd = nil
	}
	for i := 0; i < len(block); i++ {
		c := block[i]
		switch {
		case c == '\\' && i+1 < len(block) && block[i+1] == '\n':
			i++
			endWord()
		case c == '\'' || c == '"':
			end := strings.IndexByte(block[i+1:], c)
			if end < 0 {
				end = len(block) - i - 1
			}
			cur.WriteString(block[i+1 : i+1+end])
			inWord, quoted = true, true
			i += end + 1
		case c == '#' && !inWord:
			nl := strings.IndexByte(block[i:], '\n')
			if nl < 0 {
				nl = len(block) - i
			}
			i += nl - 1
		case c == '\n' || c == ';' || c == '|' || c == '&':
			endCmd()
		case c == ' ' || c == '\t':
			endWord()
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	endCmd()
	return cmds
}

// fileLike: a word that names a file or directory of the repository when it is one: a
// relative path with a slash or a file extension, and no address, URL, variable or module
// version in it.
var fileLike = regexp.MustCompile(`^(\./)?[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*/?$`)

func namesFile(w string) bool {
	if !fileLike.MatchString(w) || w == "." || w == "./..." || strings.HasPrefix(w, "-") {
		return false
	}
	if _, err := netip.ParsePrefix(w); err == nil {
		return false // an address prefix (10.0.0.0/24), not a path
	}
	if _, err := netip.ParseAddr(w); err == nil {
		return false // an address (10.0.0.1), not a file with an extension
	}
	base := filepath.Base(w)
	return strings.Contains(strings.TrimSuffix(w, "/"), "/") || strings.Contains(base, ".") && !strings.HasPrefix(base, ".")
}

// TestDocCommandsNameFilesThatExist: every file or directory a command in the code blocks
// of README.md and the guides names, run from the repository's root, exists there, unless a
// command of the same page builds it (go build -o, xcaddy build) or it stands for the
// reader's own file.
func TestDocCommandsNameFilesThatExist(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{"../README.md", "../xcaddy.md"}, pages...)
	var checked []string
	for _, page := range pages {
		built := map[string]bool{}
		blocks, starts := shellBlocks(t, page)
		for bi, block := range blocks {
			for _, cmd := range commands(block) {
				for i, w := range cmd {
					if i > 0 && cmd[i-1].text == "-o" {
						built[strings.TrimPrefix(w.text, "./")] = true
					}
				}
				if strings.Contains(cmd[0].text+" "+cmd[min(2, len(cmd)-1)].text, "xcaddy") {
					built["caddy"] = true // xcaddy build writes ./caddy
				}
				for i, w := range cmd {
					if w.quoted || !namesFile(w.text) || i > 0 && cmd[i-1].text == "-o" {
						continue
					}
					name := strings.TrimPrefix(w.text, "./")
					if _, ok := readersFiles[name]; ok || built[name] {
						continue
					}
					checked = append(checked, w.text)
					if _, err := os.Stat(filepath.Join("..", name)); err != nil {
						t.Errorf("%s: the block at line %d names %s, which the repository does not have (command: %s)",
							strings.TrimPrefix(page, "../"), starts[bi], w.text, joinWords(cmd))
					}
				}
			}
		}
	}
	if len(checked) < 20 {
		t.Fatalf("only %d file names checked (%v): the parsing lost the commands", len(checked), checked)
	}
	t.Logf("%d file names checked: %v", len(checked), checked)
}

func joinWords(ws []word) string {
	var s []string
	for _, w := range ws {
		s = append(s, w.text)
	}
	return strings.Join(s, " ")
}

// TestDocCommandsParse: the parsing the test relies on.
func TestDocCommandsParse(t *testing.T) {
	got := commands("go build -o stickylb ./cmd/stickylb && sudo ./stickylb xdp \\\n  --pools p.yaml # a comment ./x.yaml\n" +
		"curl -d '{\"a\": \"b c\"}' localhost:2020/drain | jq -r '.x\n| .y'\n")
	want := []string{"go build -o stickylb ./cmd/stickylb", "sudo ./stickylb xdp --pools p.yaml", "curl -d {\"a\": \"b c\"} localhost:2020/drain", "jq -r .x\n| .y"}
	if len(got) != len(want) {
		t.Fatalf("%d commands %v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if joinWords(got[i]) != want[i] {
			t.Errorf("command %d: %q, want %q", i, joinWords(got[i]), want[i])
		}
	}
	for w, want := range map[string]bool{"pools.example.yaml": true, "./cmd/caddy": true, "bench/xdp.sh": true, "examples/envoy/bootstrap.yaml": true,
		"./policies/chash/": true, "jar": false, "localhost:2019/stickylb/sessions": false, "10.0.0.3:18000": false, "eth0": false,
		"github.com/stickylb/stickylb@v0.0.0=$PWD": false, "/proc/sys/net": false, "--json": false, ".": false, "stickylb_": false} {
		if namesFile(w) != want {
			t.Errorf("namesFile(%q) = %v", w, !want)
		}
	}
}
