// Package docs holds the repository's prose; its test keeps the README's
// Go code identical to the tests it was copied from, so the quick starts
// compile and run because their sources do.
package docs

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// exampleMarker precedes every Go block of the README and names its source:
// a test file, and optionally the Example function whose body holds the
// block (without one, the whole file does).
var exampleMarker = regexp.MustCompile(`^<!-- example: (\S+)(?: (\S+))? -->$`)

// block is one fenced Go block of a Markdown file and where it came from.
type block struct {
	line       int    // line of the opening fence, 1-based
	file, fn   string // from the marker; empty when the block has none
	codeLines  []string
	markerLine int
}

// goBlocks returns every ```go block of md with the marker right before it.
func goBlocks(md string) ([]block, error) {
	var (
		out     []block
		cur     *block
		pending *block // marker seen, fence not yet
	)
	sc := bufio.NewScanner(strings.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur != nil && line == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.codeLines = append(cur.codeLines, line)
		case exampleMarker.MatchString(line):
			m := exampleMarker.FindStringSubmatch(line)
			pending = &block{file: m[1], fn: m[2], markerLine: n}
		case line == "```go":
			cur = &block{line: n}
			if pending != nil {
				cur.file, cur.fn, cur.markerLine = pending.file, pending.fn, pending.markerLine
			}
			pending = nil
		case strings.TrimSpace(line) != "":
			pending = nil // a marker applies only to the block right after it
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("the Go block opened on line %d is never closed", cur.line)
	}
	return out, sc.Err()
}

// sourceLines returns the lines a marked block must be copied from: the
// body of fn in file (one tab of indentation removed), or the whole file.
func sourceLines(root, file, fn string) ([]string, error) {
	src, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		return nil, err
	}
	if fn == "" {
		return strings.Split(string(src), "\n"), nil
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != fn || fd.Recv != nil || fd.Body == nil {
			continue
		}
		body := string(src[fset.Position(fd.Body.Lbrace).Offset+1 : fset.Position(fd.Body.Rbrace).Offset])
		lines := strings.Split(strings.Trim(body, "\n"), "\n")
		for i, l := range lines {
			lines[i] = strings.TrimPrefix(l, "\t")
		}
		return lines, nil
	}
	return nil, fmt.Errorf("%s has no func %s", file, fn)
}

// contains reports whether part is a contiguous run of lines of whole.
func contains(whole, part []string) bool {
	for i := 0; i+len(part) <= len(whole); i++ {
		j := 0
		for j < len(part) && whole[i+j] == part[j] {
			j++
		}
		if j == len(part) {
			return true
		}
	}
	return false
}

// problems checks every Go block of the Markdown file md under root and
// describes each one that is not marked or not copied from its source.
func problems(root, md string) ([]string, error) {
	text, err := os.ReadFile(filepath.Join(root, md))
	if err != nil {
		return nil, err
	}
	blocks, err := goBlocks(string(text))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", md, err)
	}
	if len(blocks) == 0 {
		return []string{md + ": no Go blocks found"}, nil
	}
	var out []string
	for _, b := range blocks {
		switch {
		case b.file == "":
			out = append(out, fmt.Sprintf("%s:%d: Go block without an `<!-- example: FILE [FUNC] -->` line right before it naming the test it is copied from", md, b.line))
		case !strings.HasSuffix(b.file, "_test.go"):
			out = append(out, fmt.Sprintf("%s:%d: %s is not a test file: a block must come from code that go test compiles", md, b.markerLine, b.file))
		case b.fn != "" && !strings.HasPrefix(b.fn, "Example"):
			out = append(out, fmt.Sprintf("%s:%d: %s is not an Example function", md, b.markerLine, b.fn))
		default:
			src, err := sourceLines(root, b.file, b.fn)
			if err != nil {
				out = append(out, fmt.Sprintf("%s:%d: %v", md, b.markerLine, err))
				continue
			}
			if !contains(src, b.codeLines) {
				out = append(out, fmt.Sprintf("%s:%d: the Go block is not a verbatim run of lines of %s %s; copy it again from there", md, b.line, b.file, b.fn))
			}
		}
	}
	return out, nil
}

func TestReadmeGoBlocksAreCopiedFromTests(t *testing.T) {
	probs, err := problems("..", "README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Error(p)
	}
}

func TestGoBlocksCheckerCatchesDrift(t *testing.T) {
	dir := t.TempDir()
	src := "package x\n\nfunc ExampleThing() {\n\ta := 1\n\tb := a + 1\n\t_ = b\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "x_test.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, md string
		ok       bool
	}{
		{"verbatim run", "<!-- example: x_test.go ExampleThing -->\n```go\nb := a + 1\n_ = b\n```\n", true},
		{"edited line", "<!-- example: x_test.go ExampleThing -->\n```go\nb := a + 2\n```\n", false},
		{"lines out of order", "<!-- example: x_test.go ExampleThing -->\n```go\n_ = b\nb := a + 1\n```\n", false},
		{"no marker", "```go\na := 1\n```\n", false},
		{"marker not right before the block", "<!-- example: x_test.go ExampleThing -->\ntext\n```go\na := 1\n```\n", false},
		{"unknown function", "<!-- example: x_test.go ExampleOther -->\n```go\na := 1\n```\n", false},
		{"whole file", "<!-- example: x_test.go -->\n```go\nfunc ExampleThing() {\n```\n", true},
		{"not a test file", "<!-- example: x.go -->\n```go\na := 1\n```\n", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(dir, "doc.md"), []byte(c.md), 0o644); err != nil {
				t.Fatal(err)
			}
			probs, err := problems(dir, "doc.md")
			if err != nil {
				t.Fatal(err)
			}
			if ok := len(probs) == 0; ok != c.ok {
				t.Errorf("checker passed = %v, want %v (problems: %q)", ok, c.ok, probs)
			}
		})
	}
}
