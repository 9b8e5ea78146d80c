package workpump

import (
	"errors"
	"fmt"
	"strings"
)

// ErrStopped is returned by Start after Stop. It is also the cause of a
// handler's context that Stop cancelled.
var ErrStopped = errors.New("workpump: pump stopped")

// opError is the error of a Pump call: "workpump: <op>: " and the cause's
// text without its own "workpump: " prefix, so the package is named once.
// errors.Is and errors.As see the cause.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string { return "workpump: " + e.op + ": " + detail(e.err) }

func (e *opError) Unwrap() error { return e.err }

// opErr wraps err as the error of op.
func opErr(op string, err error) error { return &opError{op: op, err: err} }

// invalid returns the error of op for bad input: it wraps
// ErrInvalidArgument and reads "workpump: <op>: invalid argument: <what>".
func invalid(op, format string, args ...any) error {
	return opErr(op, fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...))
}

// detail is err's text without a leading "workpump: ".
func detail(err error) string { return strings.TrimPrefix(err.Error(), "workpump: ") }

// optionsError is Validate's error: every problem found, each naming its
// option, joined by "; ". It wraps ErrInvalidArgument and each problem, so
// errors.Is also finds a problem's own sentinel (e.g. ErrUnknownCategory).
type optionsError struct {
	problems []error
	texts    []string
}

func (e *optionsError) Error() string {
	return ErrInvalidArgument.Error() + ": options: " + strings.Join(e.texts, "; ")
}

func (e *optionsError) Unwrap() []error {
	return append([]error{ErrInvalidArgument}, e.problems...)
}

// add records a problem of the option named field. A driver validation
// error starts with its own sentinel's text (and for the instance fields
// with "Instance."), which the option name replaces.
func (e *optionsError) add(field string, err error) {
	text := strings.TrimPrefix(err.Error(), ErrInvalidArgument.Error()+": ")
	text = strings.TrimPrefix(text, "workpump: ")
	text = strings.TrimPrefix(text, "Instance.")
	if field != "" {
		text = field + ": " + text
	}
	e.problems = append(e.problems, err)
	e.texts = append(e.texts, text)
}

// addf records a problem stated by format, which names the option.
func (e *optionsError) addf(format string, args ...any) {
	err := fmt.Errorf(format, args...)
	e.problems = append(e.problems, err)
	e.texts = append(e.texts, err.Error())
}
